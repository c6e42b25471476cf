package nodeproc_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/strategy/strategytest/internal/nodeproc"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func init() {
	// An echo node, and a parent that starts one and waits to be killed.
	pgtest.RegisterHelper("nodeproc-echo", func() int {
		var args struct{}
		return nodeproc.Serve(&args, func() (nodeproc.Handler, error) {
			return func(ctx context.Context, op string, arg json.RawMessage) (any, string, error) {
				if op == "fail" {
					return nil, "bad_request", errors.New("refused")
				}
				if op == "hang" {
					select {}
				}
				return arg, "", nil
			}, nil
		})
	})
	pgtest.RegisterHelper("nodeproc-parent", func() int {
		p, err := nodeproc.Start(context.Background(), "nodeproc-echo", struct{}{})
		if err != nil {
			fmt.Println("ERROR", err)
			return 2
		}
		fmt.Printf("CHILD %d\n", p.PID())
		select {}
	})
}

func TestCalls(t *testing.T) {
	ctx := context.Background()
	p, err := nodeproc.Start(ctx, "nodeproc-echo", struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	var got string
	if _, err := p.Call(ctx, "echo", "hello", &got); err != nil || got != "hello" {
		t.Fatalf("echo: %q, %v", got, err)
	}
	r, err := p.Call(ctx, "fail", nil, nil)
	if err != nil || r.Err != "refused" || r.Kind != "bad_request" {
		t.Fatalf("fail: %+v, %v", r, err)
	}
	done := make(chan error, 1)
	go func() { _, err := p.Call(ctx, "hang", nil, nil); done <- err }()
	if !p.Kill() {
		t.Fatal("the node did not die of SIGKILL")
	}
	if err := <-done; !errors.Is(err, nodeproc.ErrDied) {
		t.Fatalf("a call waiting when the node died: %v, want ErrDied", err)
	}
}

// TestNothingLeftBehind: a node process whose parent is SIGKILLed exits,
// even with a call still running in it.
func TestNothingLeftBehind(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), pgtest.EnvHelper+"=nodeproc-parent")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "CHILD "); ok {
			child, _ = strconv.Atoi(rest)
			break
		}
	}
	if child == 0 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("the parent never reported its node process")
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for alive(child) {
		if time.Now().After(deadline) {
			t.Fatalf("node process %d outlived its SIGKILLed parent by 30s", child)
		}
		time.Sleep(20 * time.Millisecond) // paces the question; the answer decides
	}
}

func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	f := strings.Fields(string(b))
	return !(len(f) > 2 && f[2] == "Z")
}

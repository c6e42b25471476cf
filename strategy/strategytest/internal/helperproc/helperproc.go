// Package helperproc runs a client of the fault scenarios in a process the
// harness can SIGKILL: the test binary itself, re-executed with
// pgtest.EnvHelper set (the os/exec test pattern). The two sides speak one
// line each way: the helper prints "STAGE <details>" once its work is done
// and then waits to be killed, or "UNSUPPORTED <why>" or "ERROR <text>" and
// exits.
package helperproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/reservebench/reservebench/pgtest"
)

// envArgs carries the helper's arguments, as JSON.
const envArgs = "RESERVEBENCH_HELPER_ARGS"

// ErrUnsupported is matched by Start's error when the helper reported that
// the strategy lacks what the work needs: the scenario is not applicable.
var ErrUnsupported = errors.New("not supported in a helper process")

// ErrNoStage is matched by Start's error when the helper exited or stalled
// without reporting.
var ErrNoStage = errors.New("helper process gave no STAGE line")

// Proc is a running helper.
type Proc struct {
	cmd    *exec.Cmd
	stdin  interface{ Close() error }
	stderr *strings.Builder
	// Stage is what the helper reported once its work was done.
	Stage string
}

// Start runs helper name (registered with pgtest.RegisterHelper) with args
// and waits at most a minute for its STAGE line.
func Start(ctx context.Context, name string, args any) (*Proc, error) {
	b, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), pgtest.EnvHelper+"="+name, envArgs+"="+string(b))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &Proc{cmd: cmd, stdin: stdin, stderr: &strings.Builder{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start helper: %w", err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			l := sc.Text()
			if strings.HasPrefix(l, "STAGE ") || strings.HasPrefix(l, "ERROR ") || strings.HasPrefix(l, "UNSUPPORTED ") {
				lines <- l
				break
			}
		}
		close(lines)
		for sc.Scan() { // drain, so the helper never blocks on a full pipe
		}
	}()
	fail := func(err error) (*Proc, error) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	select {
	case l, ok := <-lines:
		switch {
		case !ok:
			return fail(fmt.Errorf("%w: it exited first (does the test binary's TestMain call pgtest.Main or strategytest.Main?): %s", ErrNoStage, p.stderr.String()))
		case strings.HasPrefix(l, "UNSUPPORTED "):
			return fail(fmt.Errorf("%w: %s", ErrUnsupported, strings.TrimPrefix(l, "UNSUPPORTED ")))
		case strings.HasPrefix(l, "ERROR "):
			return fail(fmt.Errorf("helper failed: %s %s", strings.TrimPrefix(l, "ERROR "), p.stderr.String()))
		}
		p.Stage = strings.TrimPrefix(l, "STAGE ")
	case <-time.After(time.Minute):
		return fail(fmt.Errorf("%w within a minute: %s", ErrNoStage, p.stderr.String()))
	}
	return p, nil
}

// Kill sends SIGKILL and reaps the process; it reports whether the process
// died of that signal (exit "137" in a shell).
func (p *Proc) Kill() (bool, error) {
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return false, err
	}
	err := p.cmd.Wait()
	_ = p.stdin.Close()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true, nil
		}
	}
	return false, fmt.Errorf("helper did not die of SIGKILL: %v", err)
}

// Unsupported is what a helper's work returns (wrapped or not) when the
// strategy lacks what the work needs.
type Unsupported string

func (u Unsupported) Error() string { return string(u) }

// Serve is the helper side: it decodes the arguments into args, runs work,
// prints its STAGE line and waits for SIGKILL (or the parent's death, which
// closes stdin). It returns the process's exit code when work fails.
func Serve(args any, work func() (stage string, err error)) int {
	if err := json.Unmarshal([]byte(os.Getenv(envArgs)), args); err != nil {
		fmt.Printf("ERROR args: %v\n", err)
		return 2
	}
	stage, err := work()
	var u Unsupported
	switch {
	case errors.As(err, &u):
		fmt.Printf("UNSUPPORTED %s\n", u)
		return 3
	case err != nil:
		fmt.Printf("ERROR %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		return 2
	}
	fmt.Printf("STAGE %s\n", stage)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// Package nodeproc runs a node of a strategy as an operating-system process
// the harness can SIGKILL and start again: the test binary itself,
// re-executed with pgtest.EnvHelper set (the os/exec test pattern, as
// helperproc does for a client held open). Unlike a helperproc helper, a
// node process serves calls for as long as it lives: the harness writes one
// JSON request a line to its stdin, and it answers each, in any order, with
// one JSON line on its stdout that carries the request's id. Calls still
// waiting when the process dies fail with ErrDied: to their caller the
// outcome is unknown, as for a client whose server went away.
package nodeproc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/reservebench/reservebench/pgtest"
)

// envArgs carries the node's arguments, as JSON.
const envArgs = "RESERVEBENCH_NODE_ARGS"

// ErrDied is matched by the error of a call whose process died (or was
// killed) before it answered.
var ErrDied = errors.New("node process died before it answered")

// Request is one call: Op names it, the rest is the op's.
type Request struct {
	ID  uint64          `json:"id"`
	Op  string          `json:"op"`
	Arg json.RawMessage `json:"arg,omitempty"`
}

// Response answers the request with the same ID. Err is the error text;
// Kind classifies it for the caller (e.g. "bad_request").
type Response struct {
	ID     uint64          `json:"id"`
	Result json.RawMessage `json:"result,omitempty"`
	Err    string          `json:"err,omitempty"`
	Kind   string          `json:"kind,omitempty"`
}

// Proc is a running node process.
type Proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *lockedWriter
	kill   sync.Once
	killed bool

	wmu  sync.Mutex // serialises writes to stdin
	mu   sync.Mutex
	next uint64
	wait map[uint64]chan Response
	dead bool
}

// Start runs helper name (registered with pgtest.RegisterHelper, serving
// with Serve) with args and waits, at most a minute, for its "READY" line:
// the node is serving.
func Start(ctx context.Context, name string, args any) (*Proc, error) {
	b, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), pgtest.EnvHelper+"="+name, envArgs+"="+string(b))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &Proc{cmd: cmd, stdin: stdin, stderr: &lockedWriter{}, wait: map[uint64]chan Response{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node process: %w", err)
	}
	ready := make(chan error, 1)
	go p.read(out, ready)
	select {
	case err := <-ready:
		if err != nil {
			p.Kill()
			return nil, err
		}
	case <-time.After(time.Minute):
		p.Kill()
		return nil, fmt.Errorf("node process not ready within a minute: %s", p.Stderr())
	case <-ctx.Done():
		p.Kill()
		return nil, ctx.Err()
	}
	return p, nil
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Stderr is what the process wrote to its stderr so far.
func (p *Proc) Stderr() string {
	p.stderr.mu.Lock()
	defer p.stderr.mu.Unlock()
	return p.stderr.b.String()
}

// read delivers the responses, after the READY line, until the process's
// stdout closes; then every waiting call fails with ErrDied.
func (p *Proc) read(out io.Reader, ready chan<- error) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	gotReady := false
	for sc.Scan() {
		line := sc.Text()
		if !gotReady {
			switch {
			case line == "READY":
				gotReady = true
				ready <- nil
			case strings.HasPrefix(line, "ERROR "):
				ready <- fmt.Errorf("node process: %s", strings.TrimPrefix(line, "ERROR "))
				gotReady = true
			}
			continue
		}
		var r Response
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			continue // not ours (a stray print)
		}
		p.mu.Lock()
		ch := p.wait[r.ID]
		delete(p.wait, r.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	if !gotReady {
		ready <- fmt.Errorf("node process exited before it was ready: %s", p.Stderr())
	}
	p.mu.Lock()
	p.dead = true
	for id, ch := range p.wait {
		close(ch)
		delete(p.wait, id)
	}
	p.mu.Unlock()
}

// Call sends a request and waits for its response. It fails with ErrDied
// when the process dies first, and with ctx's error when ctx ends first.
func (p *Proc) Call(ctx context.Context, op string, arg any, result any) (Response, error) {
	raw, err := json.Marshal(arg)
	if err != nil {
		return Response{}, err
	}
	ch := make(chan Response, 1)
	p.mu.Lock()
	if p.dead {
		p.mu.Unlock()
		return Response{}, ErrDied
	}
	p.next++
	id := p.next
	p.wait[id] = ch
	p.mu.Unlock()
	line, err := json.Marshal(Request{ID: id, Op: op, Arg: raw})
	if err != nil {
		return Response{}, err
	}
	p.wmu.Lock()
	_, err = p.stdin.Write(append(line, '\n'))
	p.wmu.Unlock()
	if err != nil {
		return Response{}, fmt.Errorf("%w: %v", ErrDied, err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return Response{}, ErrDied
		}
		if result != nil && len(r.Result) > 0 {
			if err := json.Unmarshal(r.Result, result); err != nil {
				return r, fmt.Errorf("node process: decode %s result: %w", op, err)
			}
		}
		return r, nil
	case <-ctx.Done():
		p.mu.Lock()
		delete(p.wait, id)
		p.mu.Unlock()
		return Response{}, ctx.Err()
	}
}

// Kill sends SIGKILL and reaps the process; it reports whether it died of
// that signal. Calling it again does nothing.
func (p *Proc) Kill() bool {
	p.kill.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		err := p.cmd.Wait()
		_ = p.stdin.Close()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
				p.killed = true
			}
		}
	})
	return p.killed
}

// Handler serves one request of a node process: it returns the result to
// send back, or an error and its kind.
type Handler func(ctx context.Context, op string, arg json.RawMessage) (result any, kind string, err error)

// Serve is the node process's side: it decodes its arguments into args,
// runs setup (which opens what the node serves), prints READY and answers
// requests, each in a goroutine of its own, until stdin closes: the parent
// died or closed it. Then it returns at once, calls still running or not,
// so a node process never outlives its parent. It returns the process's
// exit code.
func Serve(args any, setup func() (Handler, error)) int {
	if err := json.Unmarshal([]byte(os.Getenv(envArgs)), args); err != nil {
		fmt.Printf("ERROR args: %v\n", err)
		return 2
	}
	h, err := setup()
	if err != nil {
		fmt.Printf("ERROR %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		return 2
	}
	var wmu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	write := func(r Response) {
		b, _ := json.Marshal(r)
		wmu.Lock()
		defer wmu.Unlock()
		_, _ = out.Write(append(b, '\n'))
		_ = out.Flush()
	}
	fmt.Println("READY")
	ctx := context.Background()
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var req Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			continue
		}
		go func() {
			res, kind, err := h(ctx, req.Op, req.Arg)
			r := Response{ID: req.ID, Kind: kind}
			if err != nil {
				r.Err = err.Error()
			}
			if res != nil {
				r.Result, _ = json.Marshal(res)
			}
			write(r)
		}()
	}
	return 0
}

// lockedWriter lets the process's stderr be read while it is written.
type lockedWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(b)
}

package pgtest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// waitExited returns once process pid has terminated (a zombie counts as
// terminated) or ctx ends. pg_ctl stop -w returns when postmaster.pid is
// gone, and the postmaster unlinks it on its way out, a moment before the
// process itself ends; callers that promise "the server is gone" wait for
// the process too. A pidfd becomes readable when its process terminates, so
// this waits on the kernel's event rather than polling.
func waitExited(ctx context.Context, pid int) error {
	if pid <= 0 {
		return nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	for {
		timeout := -1
		if deadline, ok := ctx.Deadline(); ok {
			timeout = int(time.Until(deadline).Milliseconds())
			if timeout <= 0 {
				return fmt.Errorf("process %d still running: %w", pid, context.DeadlineExceeded)
			}
		}
		// A bounded slice keeps a cancelled ctx without deadline noticed.
		if timeout < 0 || timeout > 1000 {
			timeout = 1000
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll pidfd %d: %w", pid, err)
		}
		if n > 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("process %d still running: %w", pid, err)
		}
	}
}

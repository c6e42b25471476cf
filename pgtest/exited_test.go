package pgtest

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWaitExited checks both answers: a running process keeps waitExited
// waiting until its deadline, and the same process returns it once killed
// (still unreaped, a zombie, which counts as ended).
func TestWaitExited(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, waitExited(ctx, cmd.Process.Pid), context.DeadlineExceeded)

	require.NoError(t, cmd.Process.Kill())
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	require.NoError(t, waitExited(ctx2, cmd.Process.Pid))
}

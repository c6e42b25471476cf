package redistest

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// While a server is down on purpose (Kill, Stop), every client's pool fails
// its dials until Restart, and go-redis logs each failure to stderr: one
// redis-restart trial printed hundreds of identical lines, which buried the
// one line a failing test prints. After the first fault this package
// injects, go-redis's log drops those dial failures (the commands that need
// a connection still fail with the dial's error, and the scenario judges
// them) and passes every other line through as before.

var quietOnce sync.Once

func quietDialFailures() {
	quietOnce.Do(func() { redis.SetLogger(dialFilter{log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)}) })
}

// dialFilter is go-redis's internal.Logging without the pool's dial
// failures.
type dialFilter struct{ out *log.Logger }

func (f dialFilter) Printf(_ context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "failed to dial") {
		return
	}
	_ = f.out.Output(2, msg)
}

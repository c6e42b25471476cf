package strategytest

import (
	"context"
	"sync"
	"time"
)

// giveUpKind is how the kit gives up on a call: the two ways a caller's
// context ends. A strategy may test for one (errors.Is(err,
// context.Canceled)) and answer as if nothing happened; the kit gives up
// both ways where it judges the answer (outsider round 47: Release, Confirm,
// Lookup and ExpireDue that answered 0, false or NOT_FOUND on a deadline
// alone passed, the kit having only ever cancelled).
type giveUpKind int

const (
	byCancel   giveUpKind = iota // context.Canceled
	byDeadline                   // context.DeadlineExceeded
)

func (k giveUpKind) String() string {
	if k == byDeadline {
		return "its deadline passed"
	}
	return "its caller cancelled it"
}

// withGiveUp returns a context that ends when giveUp is called, with the
// error of kind: context.Canceled, or context.DeadlineExceeded as if its
// deadline had passed at that moment (the kit gives up on a call when it
// sees it wait, which no deadline set in advance can time).
func withGiveUp(parent context.Context, kind giveUpKind) (context.Context, func()) {
	if kind == byCancel {
		return context.WithCancel(parent)
	}
	c := &giveUpCtx{Context: parent, done: make(chan struct{})}
	stop := context.AfterFunc(parent, c.end)
	return c, func() { stop(); c.end() }
}

// giveUpCtx is withGiveUp's context for byDeadline.
type giveUpCtx struct {
	context.Context
	done chan struct{}
	once sync.Once
}

func (c *giveUpCtx) end() { c.once.Do(func() { close(c.done) }) }

func (c *giveUpCtx) Done() <-chan struct{} { return c.done }

func (c *giveUpCtx) Err() error {
	select {
	case <-c.done:
		if err := c.Context.Err(); err != nil {
			return err
		}
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// Deadline is unknown in advance, as the context says: none.
func (c *giveUpCtx) Deadline() (time.Time, bool) { return time.Time{}, false }

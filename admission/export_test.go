package admission

import "time"

// SetOnWait installs a hook that runs when a call has joined the queue,
// just before it blocks: tests learn that a waiter is in place without
// sleeping.
func (g *Gate) SetOnWait(f func()) { g.onWait = f }

// SetTimer replaces the wait deadline's timer: tests fire it by hand.
func (g *Gate) SetTimer(f func(d time.Duration) (<-chan time.Time, func() bool)) { g.timer = f }

package ratelimit

import "time"

// SetClock fixes the limiter's clock, so a test never straddles a window.
func (l *Limiter) SetClock(now func() time.Time) { l.now = now }

package combine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/reservebench/reservebench/strategy"
)

// pending is one Reserve waiting for its batch's answer.
type pending struct {
	ctx      context.Context
	req      strategy.Request
	done     chan answer // buffered: the batch never waits for a caller that gave up
	requeues int
}

type answer struct {
	res strategy.Result
	err error
}

// combiner gathers the requests for one SKU that reach one node, and keeps
// at most one batch of them in flight: the requests that arrive while a
// batch runs form the next one. It never waits for company: an idle
// combiner sends the first request at once, so a lone request pays no
// window, and under load a batch holds what arrived during the previous
// batch's round trip and commit.
type combiner struct {
	d   *Deployment
	sku string

	mu    sync.Mutex
	queue []*pending
	busy  bool // a goroutine is running batches (loop)
}

// submit queues p and starts the loop unless one runs.
func (c *combiner) submit(p *pending) {
	c.mu.Lock()
	c.queue = append(c.queue, p)
	if c.busy {
		c.mu.Unlock()
		return
	}
	c.busy = true
	c.mu.Unlock()
	go c.loop()
}

// loop sends batches until the queue is empty.
func (c *combiner) loop() {
	for {
		c.mu.Lock()
		batch := c.next()
		if len(batch) == 0 {
			c.busy = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.run(batch)
	}
}

// next takes the next batch from the queue, in arrival order: at most
// MaxBatch requests, no two with one key or one user (the second waits for
// the next batch, which will see the first's outcome committed, so each
// gets the answer it would have got alone). Requests whose caller gave up
// before they were sent are dropped: nothing was written for them. The
// caller holds c.mu.
func (c *combiner) next() []*pending {
	var batch, rest []*pending
	keys, users := map[string]bool{}, map[string]bool{}
	for _, p := range c.queue {
		switch {
		case p.ctx.Err() != nil:
			p.done <- answer{err: fmt.Errorf("combine: reserve %q: not sent: %w", p.req.Key, p.ctx.Err())}
		case len(batch) < c.d.opts.MaxBatch && (!keys[p.req.Key] || c.d.opts.Mistake == KeysInOneBatch) && !users[p.req.User]:
			keys[p.req.Key], users[p.req.User] = true, true
			batch = append(batch, p)
		default:
			rest = append(rest, p)
		}
	}
	c.queue = rest
	return batch
}

// run serves one batch and answers its requests, or puts them back at the
// head of the queue. It runs under a deadline of its own: the batch serves
// every request in it, whichever of their callers gives up.
func (c *combiner) run(batch []*pending) {
	reqs := make([]strategy.Request, len(batch))
	for i, p := range batch {
		reqs[i] = p.req
	}
	c.d.countBatch(len(batch))
	parent := context.Background()
	if c.d.opts.Mistake == BatchUnderFirstCaller {
		parent = batch[0].ctx
	}
	ctx, cancel := context.WithTimeout(parent, c.d.opts.BatchTimeout)
	defer cancel()
	replies, err := serve(ctx, c.d.db, c.sku, reqs, c.d.opts.Mistake)
	var again []*pending
	for i, p := range batch {
		switch {
		case err != nil && c.d.opts.Mistake == DeadlineIsBusy && ctx.Err() != nil:
			p.done <- answer{res: strategy.Result{Outcome: strategy.OutcomeBusy}}
		case err != nil && !retryable(err) && !(c.d.opts.Mistake == ResendsAfterEOF && errors.Is(err, io.ErrUnexpectedEOF)) &&
			!(c.d.opts.Mistake == FailedBatchErrorToFirst && i > 0):
			p.done <- answer{err: fmt.Errorf("combine: reserve %q: in a batch of %d: %w", p.req.Key, len(batch), err)}
		case err == nil && replies[i].err != nil:
			p.done <- answer{err: fmt.Errorf("combine: reserve %q: %w", p.req.Key, replies[i].err)}
		case err != nil || replies[i].requeue:
			if p.requeues >= c.d.opts.MaxRequeues {
				if err == nil && c.d.opts.Mistake == GaveUpSoldOut {
					p.done <- answer{res: strategy.Result{Outcome: strategy.OutcomeSoldOut}}
					continue
				}
				p.done <- answer{err: fmt.Errorf("combine: reserve %q: %w (last error: %v)", p.req.Key, errGaveUp, err)}
				continue
			}
			p.requeues++
			again = append(again, p)
		default:
			p.done <- answer{res: replies[i].res}
		}
	}
	if len(again) > 0 {
		c.d.requeued.Add(int64(len(again)))
		c.mu.Lock()
		c.queue = append(again, c.queue...)
		c.mu.Unlock()
	}
}

// retryable reports whether PostgreSQL refused the batch as a whole in a
// way a new attempt can overcome, having written nothing: a serialization
// failure or a deadlock.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

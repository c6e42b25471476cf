package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/admission/pgslots"
	"github.com/reservebench/reservebench/service"
	"github.com/reservebench/reservebench/strategy"
)

// serve runs the serve subcommand until SIGTERM or SIGINT.
func serve(args []string, stdout, stderr io.Writer) error {
	cfg, err := parseServe(args, stderr)
	if err != nil {
		return err
	}
	logger := log.New(stderr, "reservebench: ", log.LstdFlags|log.Lmsgprefix)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	db, err := openDatabase(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer db.close(logger)
	res, err := openResources(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer res.Close()

	scfg := strategy.Config{DB: db.pool, Stock: cfg.stock, Resources: res.Addrs()}
	var dep strategy.Deployment
	if cfg.attach {
		if cfg.meta.Attach == nil {
			return &UsageError{Flag: "attach", Reason: cfg.meta.Name + " cannot attach to stock another process loaded (no Meta.Attach)"}
		}
		dep, err = cfg.meta.Attach(ctx, scfg)
	} else {
		dep, err = cfg.meta.Open(ctx, scfg)
		if errors.Is(err, strategy.ErrStockExists) {
			err = fmt.Errorf("%w (another serve process loaded it: start this one with -attach)", err)
		}
	}
	if err != nil {
		return fmt.Errorf("deploy %s: %w", cfg.meta.Name, err)
	}
	defer dep.Close()
	node := dep.Node(0)
	caps := strategy.Probe(cfg.meta, dep)

	local, err := admission.New(node, cfg.limits)
	if err != nil {
		return &UsageError{Reason: err.Error()}
	}
	var gate service.Admission = local
	if cfg.globalSlots > 0 {
		if gate, err = pgslots.New(local, db.pool, cfg.globalSlots, pgslots.DefaultKey); err != nil {
			return &UsageError{Flag: "global-inflight", Reason: err.Error()}
		}
	}
	svc, err := service.New(service.Config{Strategy: node, Name: cfg.meta.Name, Admission: gate, WorkTimeout: cfg.workTimeout})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := svc.Server(cfg.timeouts)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	global := ""
	if cfg.globalSlots > 0 {
		global = fmt.Sprintf(", %d in flight across every process on the database", cfg.globalSlots)
	}
	fmt.Fprintf(stdout, "serving %s on http://%s (in flight %d, queue %d, wait %v%s); stock %s\n",
		cfg.meta.Name, ln.Addr(), cfg.limits.InFlight, cfg.limits.Queue, cfg.limits.Wait, global, stockString(cfg.stock))
	fmt.Fprintf(stdout, "try: curl -si -d 'request_key=req-0001&user=user-0042&sku=%s&ttl_ms=60000' http://%s/reserve\n", cfg.stock[0].SKU, ln.Addr())

	var expired expiryCount
	jobsDone := make(chan struct{})
	jobsCtx, stopJobs := context.WithCancel(context.Background())
	defer stopJobs()
	go func() {
		defer close(jobsDone)
		runJobs(jobsCtx, cfg, caps, node, svc, &expired, logger)
	}()

	select {
	case err := <-served:
		stopJobs()
		<-jobsDone
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	logger.Printf("stopping: no more admissions; finishing %d admitted request(s)", svc.Stats().Running)
	svc.Drain()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.limits.Wait+cfg.workTimeout+10*time.Second)
	defer cancel()
	shutdownErr := srv.Shutdown(shutdownCtx)
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	stopJobs()
	<-jobsDone
	st := svc.Stats()
	logger.Printf("stopped: %v; expired %d", st, expired.units)
	if shutdownErr != nil {
		return fmt.Errorf("shutdown: %d request(s) still running: %w", st.Running, shutdownErr)
	}
	return nil
}

type expiryCount struct{ units int }

// runJobs runs the expiry job (outside admission: it must never be refused
// as overflow) and logs the counters, until ctx ends.
func runJobs(ctx context.Context, cfg *serveConfig, caps strategy.Capabilities, node strategy.Strategy, svc *service.Service, expired *expiryCount, logger *log.Logger) {
	var expireTick, logTick <-chan time.Time
	if cfg.expireEvery > 0 && caps.Expire {
		t := time.NewTicker(cfg.expireEvery)
		defer t.Stop()
		expireTick = t.C
	}
	if cfg.logEvery > 0 {
		t := time.NewTicker(cfg.logEvery)
		defer t.Stop()
		logTick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-expireTick:
			jobCtx, cancel := context.WithTimeout(ctx, cfg.workTimeout)
			n, err := node.(strategy.Expirer).ExpireDue(jobCtx)
			cancel()
			if err != nil && ctx.Err() == nil {
				logger.Printf("expiry job: %v", err)
			}
			expired.units += n
		case <-logTick:
			logger.Printf("%v; expired %d", svc.Stats(), expired.units)
		}
	}
}

func stockString(st []strategy.Stock) string {
	s := ""
	for i, x := range st {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s=%d", x.SKU, x.Total)
	}
	return s
}

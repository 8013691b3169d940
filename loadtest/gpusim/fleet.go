package gpusim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// FleetConfig describes N instances served by one process on consecutive
// ports.
type FleetConfig struct {
	// N is the number of instances (at least 1).
	N int
	// ListenHost is the address to listen on; "" means 127.0.0.1.
	ListenHost string
	// FirstPort is instance 0's port; instance i listens on FirstPort+i.
	// 0 gives every instance its own free port.
	FirstPort int
	// NamePrefix names instance i NamePrefix+i; "" means "gpu-".
	NamePrefix string
	// Instance is the model every instance runs; its Name is replaced.
	Instance Config
	// InstanceLoRAModules are adapters served from the start by one
	// instance only (by index), after Instance.LoRAModules.
	InstanceLoRAModules map[int][]LoRAModule
}

// Fleet is a set of running instances, each with its own HTTP server.
type Fleet struct {
	instances []*Instance
	servers   []*http.Server
	urls      []string
	wg        sync.WaitGroup
	stop      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// StartFleet starts cfg.N instances and their servers. The fleet runs until
// Close is called or ctx is cancelled; Close waits for everything to stop.
func StartFleet(ctx context.Context, cfg FleetConfig) (*Fleet, error) {
	if cfg.N < 1 {
		return nil, fmt.Errorf("%w: fleet size %d < 1", ErrInvalidConfig, cfg.N)
	}
	if cfg.FirstPort < 0 || cfg.FirstPort+cfg.N-1 > 65535 {
		return nil, fmt.Errorf("%w: ports %d..%d out of range", ErrInvalidConfig, cfg.FirstPort, cfg.FirstPort+cfg.N-1)
	}
	host := cfg.ListenHost
	if host == "" {
		host = "127.0.0.1"
	}
	prefix := cfg.NamePrefix
	if prefix == "" {
		prefix = "gpu-"
	}
	for i := range cfg.InstanceLoRAModules {
		if i < 0 || i >= cfg.N {
			return nil, fmt.Errorf("%w: LoRA modules for instance %d of %d", ErrInvalidConfig, i, cfg.N)
		}
	}
	f := &Fleet{stop: make(chan struct{})}
	var lc net.ListenConfig
	for i := 0; i < cfg.N; i++ {
		ic := cfg.Instance
		ic.Name = prefix + strconv.Itoa(i)
		if own := cfg.InstanceLoRAModules[i]; len(own) > 0 {
			ic.LoRAModules = append(slices.Clone(ic.LoRAModules), own...)
		}
		port := 0
		if cfg.FirstPort != 0 {
			port = cfg.FirstPort + i
		}
		in, err := New(ic)
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			_ = in.Close()
			_ = f.Close()
			return nil, fmt.Errorf("gpusim: instance %s: %w", ic.Name, err)
		}
		srv := &http.Server{Handler: in, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
		f.instances = append(f.instances, in)
		f.servers = append(f.servers, srv)
		f.urls = append(f.urls, "http://"+ln.Addr().String())
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			_ = srv.Serve(ln) // returns http.ErrServerClosed on Close
		}()
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		select {
		case <-ctx.Done():
			f.shutdown()
		case <-f.stop:
		}
	}()
	return f, nil
}

// URLs returns each instance's base URL ("http://host:port"), in order.
func (f *Fleet) URLs() []string { return append([]string(nil), f.urls...) }

// Instances returns the instances, in order.
func (f *Fleet) Instances() []*Instance { return append([]*Instance(nil), f.instances...) }

// Close stops every instance and server and waits for them. Calling it
// again returns the first result.
func (f *Fleet) Close() error {
	f.shutdown()
	f.wg.Wait()
	return f.closeErr
}

func (f *Fleet) shutdown() {
	f.closeOnce.Do(func() {
		close(f.stop)
		// Closing the instances first makes in-flight handlers abort and
		// return, so Shutdown does not wait for long generations.
		for _, in := range f.instances {
			_ = in.Close()
		}
		var errs []error
		for _, srv := range f.servers {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := srv.Shutdown(ctx); err != nil {
				errs = append(errs, err)
				_ = srv.Close()
			}
			cancel()
		}
		f.closeErr = errors.Join(errs...)
	})
}

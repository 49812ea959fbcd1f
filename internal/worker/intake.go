package worker

import (
	"context"
	"fmt"

	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/intake"
	"github.com/natsagent/natsagent/internal/submit"
)

// serveIntake starts the submit service (P.submit.>, one queue group over
// every worker): tenants in their own NATS accounts submit through it.
func (w *Worker) serveIntake() (stop func(), err error) {
	s, err := intake.Start(w.nc, intake.Config{
		Settings: w.cfg.Settings,
		Stores:   w.stores,
		Queue:    &submit.Queue{JS: w.js, Names: w.names, Stores: w.stores, Events: w.pub, Submitter: "intake"},
		Logger:   w.log,
		Limits:   w.cfg.Limits,
		Hooks:    w.cfg.Submit,
		Metrics:  w.cfg.Metrics,
	})
	if err != nil {
		return nil, fmt.Errorf("serve the submit service: %w", err)
	}
	return s.Stop, nil
}

// serveDelete starts the delete service (P.ctl.<tenant>.<thread>.delete
// and P.ctl.<tenant>.<thread>.<run>.delete, one queue group over every
// worker), with the submit service's rules for who may use a thread.
func (w *Worker) serveDelete(ctx context.Context) (stop func(), err error) {
	e, err := erase.New(ctx, erase.Config{NC: w.nc, JS: w.js, Names: w.names, Stores: w.stores, Files: w.cfg.Files, Logger: w.log, Metrics: w.cfg.Metrics})
	if err != nil {
		return nil, fmt.Errorf("serve the delete service: %w", err)
	}
	s, err := erase.Serve(w.nc, erase.ServiceConfig{Eraser: e, Logger: w.log, Roles: w.cfg.Submit.Roles, MayUseThread: w.cfg.Submit.MayUseThread})
	if err != nil {
		return nil, fmt.Errorf("serve the delete service: %w", err)
	}
	return s.Stop, nil
}

package app

import (
	"runtime/debug"
	"testing"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/config"
)

func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestApplyGC(t *testing.T) {
	before := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(before) })

	applyGC(config.Worker{GOGC: 400}, "", zap.NewNop())
	if p := gcPercent(); p != 400 {
		t.Fatalf("worker.gogc 400 left GOGC at %d", p)
	}
	applyGC(config.Worker{GOGC: -1}, "", zap.NewNop())
	if p := gcPercent(); p != -1 {
		t.Fatalf("worker.gogc -1 left GOGC at %d, not off", p)
	}
	debug.SetGCPercent(100)
	applyGC(config.Worker{GOGC: 400}, "200", zap.NewNop())
	if p := gcPercent(); p != 100 {
		t.Fatalf("with GOGC set in the environment, worker.gogc changed the setting to %d", p)
	}
	applyGC(config.Worker{}, "", zap.NewNop())
	if p := gcPercent(); p != 100 {
		t.Fatalf("worker.gogc 0 changed the setting to %d", p)
	}
}

func TestGOGCValidated(t *testing.T) {
	cfg := config.Default()
	cfg.Worker.GOGC = -2
	if err := cfg.Validate(); err == nil {
		t.Fatal("worker.gogc -2 accepted")
	}
	cfg.Worker.GOGC = 400
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

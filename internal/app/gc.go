package app

import (
	"os"
	"runtime/debug"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/config"
)

// ApplyGC sets the garbage collector's target percentage of a process
// that runs workers from worker.gogc (docs/configuration.md), unless the
// GOGC environment variable is set: the runtime has applied that one
// already, and the environment overrides the file everywhere else too.
// It logs the setting in force.
func ApplyGC(w config.Worker, log *zap.Logger) {
	applyGC(w, os.Getenv("GOGC"), log)
}

func applyGC(w config.Worker, env string, log *zap.Logger) {
	switch {
	case env != "":
		log.Info("garbage collector", zap.String("gogc", env), zap.String("from", "GOGC"))
	case w.GOGC == 0:
		// Go's default; nothing to set.
	default:
		debug.SetGCPercent(w.GOGC)
		log.Info("garbage collector", zap.Int("gogc", w.GOGC), zap.String("from", "worker.gogc"))
	}
}

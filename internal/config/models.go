package config

import "fmt"

// ModelInfo describes a model the deployment's profiles use: what the
// provider does not report but the harness must know, such as how many
// tokens fit in one request.
type ModelInfo struct {
	// Name is the model name as profiles and the provider spell it
	// (agents[].model, model.name).
	Name string `yaml:"name"`
	// ContextWindow is the model's input window in tokens. It takes
	// precedence over the built-in table of known model names and is
	// overridden only by a profile's token_usage.context_window.
	ContextWindow int `yaml:"context_window"`
}

// ContextWindows maps the configured model names to their windows.
func (c *Config) ContextWindows() map[string]int {
	if len(c.Models) == 0 {
		return nil
	}
	windows := make(map[string]int, len(c.Models))
	for _, m := range c.Models {
		windows[m.Name] = m.ContextWindow
	}
	return windows
}

func validateModels(models []ModelInfo, bad func(path, format string, args ...any)) {
	seen := make(map[string]bool, len(models))
	for i, m := range models {
		path := fmt.Sprintf("models[%d]", i)
		switch {
		case m.Name == "":
			bad(path+".name", "is required")
		case seen[m.Name]:
			bad(path+".name", "%q is listed twice", m.Name)
		}
		seen[m.Name] = true
		if m.ContextWindow < 1024 {
			bad(path+".context_window", "must be the model's input window in tokens (at least 1024), not %d", m.ContextWindow)
		}
	}
}

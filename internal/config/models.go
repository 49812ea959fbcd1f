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
	// overridden only by a profile's token_usage.context_window. 0 (not
	// set): the built-in table decides.
	ContextWindow int `yaml:"context_window"`
	// Vision false says the model takes no image input: image parts of
	// a run's transcript reach it as text notes naming their files.
	// Unset: images are sent (an agent profile's vision overrides).
	Vision *bool `yaml:"vision"`
}

// ContextWindows maps the configured model names to their windows.
func (c *Config) ContextWindows() map[string]int {
	if len(c.Models) == 0 {
		return nil
	}
	windows := make(map[string]int, len(c.Models))
	for _, m := range c.Models {
		if m.ContextWindow > 0 {
			windows[m.Name] = m.ContextWindow
		}
	}
	return windows
}

// Vision maps the configured model names that say whether they see
// images to that answer.
func (c *Config) Vision() map[string]bool {
	var vision map[string]bool
	for _, m := range c.Models {
		if m.Vision != nil {
			if vision == nil {
				vision = make(map[string]bool)
			}
			vision[m.Name] = *m.Vision
		}
	}
	return vision
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
		if m.ContextWindow != 0 && m.ContextWindow < 1024 {
			bad(path+".context_window", "must be the model's input window in tokens (at least 1024), not %d", m.ContextWindow)
		}
		if m.ContextWindow == 0 && m.Vision == nil {
			bad(path, "says nothing of the model: set context_window or vision")
		}
	}
}

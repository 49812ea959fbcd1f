package agent_test

import (
	"encoding/json"
	"maps"
	"testing"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tools"
)

// The models whose view_image decides by their name whether they see
// images are the ones nothing else decides for: not the profile's vision,
// not the models entry's, not view_image's own.
func TestVisionGuessesNameTheModelsDecidedByName(t *testing.T) {
	viewImage := func(settings string) middleware.ChainConfig {
		return middleware.ChainConfig{Settings: map[string]json.RawMessage{"view_image": json.RawMessage(settings)}}
	}
	no := false
	m := model.NewScripted(func(int, *model.Request) model.Reply { return model.Reply{Text: "x"} })
	a, err := agent.NewAgentsWith(agent.Resources{Model: m, Tools: tools.NewRegistry(), Vision: map[string]bool{"gpt-4o-said": false}},
		agent.Profile{Name: "guessed_sees", Model: "gpt-4o-mini", Middleware: viewImage(`{"enabled": true}`)},
		agent.Profile{Name: "guessed_blind", Model: "my-local-llama", Middleware: viewImage(`{"enabled": true}`)},
		agent.Profile{Name: "profile_says", Model: "gpt-4.1-a", Vision: &no, Middleware: viewImage(`{"enabled": true}`)},
		agent.Profile{Name: "models_entry_says", Model: "provider/gpt-4o-said", Middleware: viewImage(`{"enabled": true}`)},
		agent.Profile{Name: "view_image_says", Model: "gpt-5-b", Middleware: viewImage(`{"enabled": true, "vision": true}`)},
		agent.Profile{Name: "no_view_image", Model: "gpt-5-c"},
	)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"gpt-4o-mini": true, "my-local-llama": false}
	if got := a.VisionGuesses(); !maps.Equal(got, want) {
		t.Fatalf("guesses %v, want %v", got, want)
	}
}

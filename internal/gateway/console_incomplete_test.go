package gateway

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/natsagent/natsagent/internal/model"
)

// A run a guard cut short reads incomplete in the console, not success:
// in the run view (its status, coloured as a warning, and the guard that
// stopped it) and in the thread's run list (a badge the stylesheet
// colours like the run view's, and the guard in the note). The model asks
// for the same call again and again, so loop detection stops the run.
func TestConsoleIncompleteRun(t *testing.T) {
	p := openBrowserFor(t, 3*time.Minute)
	m := model.NewScripted(func(int, *model.Request) model.Reply {
		return model.Reply{ToolCalls: []model.ToolCall{{ID: "c", Name: "current_time", Arguments: `{}`}}}
	})
	e := newEnvWith(t, m, keyed)
	base := e.http.URL
	p.signIn(t, base+"/console/")

	p.do(t, "submit a run that loops",
		typeInto(chromedp.ID("run-message"), "what time is it, again and again?"),
		chromedp.Click(chromedp.ID("run-submit")))
	p.waitText(t, "#run-status", equals("incomplete"))
	if got := p.eval(t, `document.querySelector("#run-status").dataset.status`); got != "incomplete" {
		t.Fatalf("the run status is marked %q", got)
	}
	p.waitText(t, "#run-stop", contains("loop_capped"))
	warn := p.eval(t, `getComputedStyle(document.querySelector("#run-status")).color`)
	run := p.eval(t, "location.hash")
	run = run[strings.LastIndex(run, "/")+1:]

	p.do(t, "open the thread", chromedp.Click(chromedp.ID("run-thread-link")))
	badge := fmt.Sprintf(`#runs tr[data-run-id=%q] .badge`, run)
	p.waitText(t, badge, equals("incomplete"))
	if got := p.eval(t, `document.querySelector(`+fmt.Sprintf("%q", badge)+`).className`); !strings.Contains(got, "status-incomplete") {
		t.Fatalf("the run list's badge has class %q: an incomplete run looks like an unknown status", got)
	}
	if got := p.eval(t, `getComputedStyle(document.querySelector(`+fmt.Sprintf("%q", badge)+`)).color`); got != warn {
		t.Fatalf("the badge is %s, the run view's status %s", got, warn)
	}
	p.waitText(t, fmt.Sprintf(`#runs tr[data-run-id=%q] .run-note`, run), contains("loop_capped"))
	p.checkClean(t, base)
}

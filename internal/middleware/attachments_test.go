package middleware_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

// The <attachments> block goes into the last user message of every
// request of the run, once, and never into state.
func TestAttachments_RequestOnly(t *testing.T) {
	w := files.NewMemory()
	ctx := context.Background()
	for _, p := range []string{"/uploads/report.csv", "/uploads/photos/cat.txt", "/notes/private.md"} {
		if err := w.Write(ctx, p, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	earlier := &state.State{Messages: []model.Message{
		{ID: "u0", Role: model.RoleUser, Content: "an earlier question"},
		{ID: "a0", Role: model.RoleAssistant, Content: "an earlier answer"},
	}}
	scripted := toolThenAnswer()
	r := runWithFiles(t, earlier, offloadChain(t, ""), scripted, echoTool(t), w,
		model.Message{ID: "u1", Role: model.RoleUser, Content: "Summarize my report."})

	reqs := scripted.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d model calls", len(reqs))
	}
	want := "Summarize my report.\n\n<attachments>\nThe person attached these files; they are in the workdir, and read_file reads them (pass the path):\n" +
		"photos/cat.txt: /uploads/photos/cat.txt\nreport.csv: /uploads/report.csv\n</attachments>"
	for i, req := range reqs {
		var users []string
		n := 0
		for _, m := range req.Messages {
			if m.Role == model.RoleUser {
				users = append(users, m.Content)
			}
			n += strings.Count(m.Content, "<attachments>")
		}
		if len(users) != 2 || users[0] != "an earlier question" || users[1] != want {
			t.Errorf("request %d user messages = %q", i, users)
		}
		if n != 1 {
			t.Errorf("request %d carries %d blocks", i, n)
		}
		if strings.Contains(users[1], "private.md") {
			t.Errorf("request %d lists a file outside /uploads", i)
		}
	}
	for name, st := range map[string]*state.State{"state": r.st, "checkpoints": r.host.replay()} {
		for _, m := range st.Messages {
			if strings.Contains(m.Content, "attachments") {
				t.Errorf("%s holds the block: %+v", name, m)
			}
		}
		if i := st.Index("u1"); i < 0 || st.Messages[i].Content != "Summarize my report." {
			t.Errorf("%s: the user message is not as written", name)
		}
	}
}

func TestAttachments_NoneWithoutUploads(t *testing.T) {
	for name, w := range map[string]files.Workdir{"empty workdir": files.NewMemory(), "no workdir": nil} {
		scripted := toolThenAnswer()
		runWithFiles(t, &state.State{}, offloadChain(t, ""), scripted, echoTool(t), w)
		for _, req := range scripted.Requests() {
			for _, m := range req.Messages {
				if strings.Contains(m.Content, "<attachments>") {
					t.Errorf("%s: a block without uploads: %q", name, m.Content)
				}
			}
		}
	}
}

func TestAttachments_BlockIsCapped(t *testing.T) {
	var infos []files.Info
	for i := range 3 {
		infos = append(infos, files.Info{Path: fmt.Sprintf("/uploads/f%d.txt", i)})
	}
	block := middleware.AttachmentsBlock(infos, 7)
	if !strings.Contains(block, "f2.txt: /uploads/f2.txt\n... and 7 more files; ls with path /uploads lists them all.\n</attachments>") {
		t.Errorf("block = %q", block)
	}
	if middleware.AttachmentsBlock(nil, 0) != "" {
		t.Error("a block for no files")
	}
	w := files.NewMemory()
	for i := range 5 {
		_ = w.Write(context.Background(), fmt.Sprintf("/uploads/%d.txt", i), []byte("x"))
	}
	att, err := middleware.NewAttachments(middleware.Attachments{MaxFiles: 2})
	if err != nil {
		t.Fatal(err)
	}
	scripted := toolThenAnswer()
	runWithFiles(t, &state.State{}, newChain(t, att), scripted, echoTool(t), w)
	last := scripted.Requests()[0].Messages
	if got := last[len(last)-1].Content; !strings.Contains(got, "1.txt: /uploads/1.txt\n... and 3 more files") {
		t.Errorf("capped block: %q", got)
	}
}

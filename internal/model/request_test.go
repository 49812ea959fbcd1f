package model

import "testing"

func TestLastUserContent(t *testing.T) {
	req := &Request{Messages: []Message{
		{Role: RoleUser, Content: "first"},
		{Role: RoleAssistant, Content: "answer"},
		{Role: RoleUser, Content: "second"},
		{Role: RoleTool, Content: "result"},
	}}
	if got := req.LastUserContent(); got != "second" {
		t.Fatalf("LastUserContent() = %q, want second", got)
	}
	// The trailing context message is the system's, not the person's.
	req.Messages = append(req.Messages, Message{Role: RoleUser, Name: ContextMessageName, Content: "<system-reminder>...</system-reminder>"})
	if got := req.LastUserContent(); got != "second" {
		t.Fatalf("LastUserContent() with a trailing context = %q, want second", got)
	}
	if got := (&Request{Messages: []Message{{Role: RoleAssistant, Content: "x"}}}).LastUserContent(); got != "" {
		t.Fatalf("no user message: %q", got)
	}
}

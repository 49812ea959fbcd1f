package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/protocol"
)

// style colours text for a terminal; the zero style writes plain text.
type style struct{ on bool }

// styleFor colours stdout only when it is a terminal and NO_COLOR is
// unset (https://no-color.org).
func styleFor(std stdio) style {
	if std.outFile == nil || os.Getenv("NO_COLOR") != "" || os.Getenv("TERM") == "dumb" {
		return style{}
	}
	st, err := std.outFile.Stat()
	return style{on: err == nil && st.Mode()&os.ModeCharDevice != 0}
}

func (s style) wrap(code, text string) string {
	if !s.on || text == "" {
		return text
	}
	return "\x1b[" + code + "m" + text + "\x1b[0m"
}

func (s style) dim(t string) string    { return s.wrap("2", t) }
func (s style) bold(t string) string   { return s.wrap("1", t) }
func (s style) red(t string) string    { return s.wrap("31", t) }
func (s style) green(t string) string  { return s.wrap("32", t) }
func (s style) yellow(t string) string { return s.wrap("33", t) }
func (s style) cyan(t string) string   { return s.wrap("36", t) }

// status colours a run status by what it asks of the reader.
func (s style) status(st protocol.Status) string {
	switch st {
	case protocol.StatusSuccess:
		return s.green(string(st))
	case protocol.StatusError, protocol.StatusCancelled, protocol.StatusTimeout, protocol.StatusRejected:
		return s.red(string(st))
	case protocol.StatusInterrupted, protocol.StatusSteered, protocol.StatusIncomplete:
		return s.yellow(string(st))
	}
	// Plain, in codes as long as the colours' (aligned tables).
	return s.wrap("39", string(st))
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// oneLine flattens text to one line of at most n characters.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// ago renders a past time for a listing.
func ago(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return t.Local().Format("2006-01-02 15:04:05")
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return t.Local().Format("2006-01-02 15:04")
}

// span renders the duration between two times of a record, "-" when one
// is missing.
func span(from, to *time.Time) string {
	if from == nil || to == nil {
		return "-"
	}
	return roundDuration(to.Sub(*from))
}

func roundDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// count renders n with thousands separators.
func count(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

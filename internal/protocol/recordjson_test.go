package protocol

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/model"
)

// filler sets every exported field of a value at random, through
// reflection, so a field added to a record is exercised (and caught if
// the hand encoder misses it) without the test changing.
type filler struct {
	rnd *rand.Rand
	// extra is one more string the values are drawn from (the fuzzer's).
	extra string
}

var fillStrings = []string{
	"", "r1", "default", "hello world", `quote " and \ backslash`, "<script>&amp;</script>",
	"line\nbreak\ttab\rcr\b\f", "\x00\x01\x1f\x7f", "é ü 日本語 🙂", "\u2028\u2029", "\xff\xfe bad utf8 \xc3",
	"ends in half a rune \xe2\x80", "run.finished", "2026-12-01T00:00:00Z",
}

var fillZones = []*time.Location{
	time.UTC, time.FixedZone("p530", 5*3600+30*60), time.FixedZone("m8", -8*3600),
	time.FixedZone("secs", 3600+17), time.FixedZone("big", 24*3600), time.FixedZone("neg big", -25*3600),
}

func (f *filler) string() string {
	if f.rnd.IntN(len(fillStrings)+1) == 0 {
		return f.extra
	}
	return fillStrings[f.rnd.IntN(len(fillStrings))]
}

func (f *filler) time() time.Time {
	switch f.rnd.IntN(30) {
	case 0:
		return time.Time{}
	case 1:
		// Outside what MarshalJSON accepts, sometimes.
		return time.Date(f.rnd.IntN(20001)-5000, time.March, 3, 4, 5, 6, 7, time.UTC)
	}
	t := time.Unix(f.rnd.Int64N(4e9), f.rnd.Int64N(1e9))
	if f.rnd.IntN(3) == 0 {
		t = t.Truncate(time.Second)
	}
	zones := fillZones[:4] // the last two MarshalJSON refuses
	if f.rnd.IntN(30) == 0 {
		zones = fillZones
	}
	return t.In(zones[f.rnd.IntN(len(zones))])
}

// any returns what a free-form field may hold: JSON's own types, the Go
// types code puts there, and now and then one the hand encoder does not
// know or a value encoding/json refuses.
func (f *filler) any(depth int) any {
	n := 12
	if depth > 2 {
		n = 7
	}
	switch f.rnd.IntN(n) {
	case 0:
		return nil
	case 1:
		return f.string()
	case 2:
		return f.rnd.IntN(2) == 0
	case 3:
		return []float64{0, 1, -1.5, 1e-7, 1e21, 123456789, 1e20, 5e-324, math.MaxFloat64, 0.000001, -1e-6}[f.rnd.IntN(11)] * float64(f.rnd.IntN(3)-1)
	case 4:
		return json.Number([]string{"", "0", "12345678901234567890", "-1.5e+10", "1E3", "01", "1.", "-", "abc", "1e"}[f.rnd.IntN(10)])
	case 5:
		return f.rnd.IntN(2000) - 1000
	case 6:
		switch f.rnd.IntN(6) {
		case 0:
			return math.NaN()
		case 1:
			return struct{ X int }{3}
		case 2:
			return Status("odd")
		case 3:
			return int64(-7)
		case 4:
			return []string{f.string(), f.string()}
		}
		return []string(nil)
	case 7, 8, 9:
		var m map[string]any
		if f.rnd.IntN(6) > 0 {
			m = map[string]any{}
			for range f.rnd.IntN(4) {
				m[f.string()] = f.any(depth + 1)
			}
		}
		return m
	}
	var s []any
	if f.rnd.IntN(6) > 0 {
		s = []any{}
		for range f.rnd.IntN(4) {
			s = append(s, f.any(depth+1))
		}
	}
	return s
}

var timeType = reflect.TypeFor[time.Time]()

func (f *filler) fill(v reflect.Value, depth int) {
	if v.Type() == timeType {
		v.Set(reflect.ValueOf(f.time()))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(f.string())
	case reflect.Bool:
		v.SetBool(f.rnd.IntN(2) == 0)
	case reflect.Int, reflect.Int64:
		if f.rnd.IntN(3) > 0 {
			v.SetInt(f.rnd.Int64N(2001) - 1000)
		} else if f.rnd.IntN(2) == 0 {
			v.SetInt(math.MinInt64)
		}
	case reflect.Float64:
		v.SetFloat([]float64{0, 1, -1.5, 1e-7, 1e21, 0.0121484375, 1e20, 5e-324, math.MaxFloat64, 0.000001, -1e-6}[f.rnd.IntN(11)] * float64(f.rnd.IntN(3)-1))
	case reflect.Uint64:
		if f.rnd.IntN(3) > 0 {
			v.SetUint(f.rnd.Uint64() >> f.rnd.IntN(64))
		}
	case reflect.Pointer:
		if f.rnd.IntN(3) > 0 {
			p := reflect.New(v.Type().Elem())
			f.fill(p.Elem(), depth+1)
			v.Set(p)
		}
	case reflect.Slice:
		switch f.rnd.IntN(4) {
		case 0:
			return
		case 1:
			v.Set(reflect.MakeSlice(v.Type(), 0, 0))
			return
		}
		s := reflect.MakeSlice(v.Type(), 1+f.rnd.IntN(3), 3)
		for i := range s.Len() {
			f.fill(s.Index(i), depth+1)
		}
		v.Set(s)
	case reflect.Map:
		switch f.rnd.IntN(4) {
		case 0:
			return
		case 1:
			v.Set(reflect.MakeMap(v.Type()))
			return
		}
		m := reflect.MakeMap(v.Type())
		for range 1 + f.rnd.IntN(3) {
			k := reflect.New(v.Type().Key()).Elem()
			f.fill(k, depth+1)
			e := reflect.New(v.Type().Elem()).Elem()
			f.fill(e, depth+1)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Interface:
		if x := f.any(depth); x != nil {
			v.Set(reflect.ValueOf(x))
		}
	case reflect.Struct:
		if depth > 0 && f.rnd.IntN(4) == 0 {
			return // zero, for omitzero
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				f.fill(v.Field(i), depth+1)
			}
		}
	default:
		panic("filler: no values for " + v.Type().String())
	}
}

// checkSame fails t unless enc writes what json.Marshal writes for v,
// or fails as it fails. It reports whether the hand encoder wrote it
// without falling back.
func checkSame[T any](t *testing.T, v *T, enc func([]byte, *T) ([]byte, error), hand func([]byte, *T) ([]byte, bool)) bool {
	t.Helper()
	want, wantErr := json.Marshal(v)
	prefix := []byte("prefix:")
	got, err := enc(append([]byte(nil), prefix...), v)
	if (err != nil) != (wantErr != nil) || (err != nil && err.Error() != wantErr.Error()) {
		t.Fatalf("error %v, encoding/json says %v; record %+v", err, wantErr, v)
	}
	if err != nil {
		return false
	}
	if !bytes.HasPrefix(got, prefix) {
		t.Fatalf("the bytes before the record changed: %q", got)
	}
	if got = got[len(prefix):]; !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		from := max(0, i-40)
		t.Fatalf("hand-encoded record differs from encoding/json at byte %d:\n got …%s\nwant …%s", i, got[from:min(len(got), i+40)], want[from:min(len(want), i+40)])
	}
	_, ok := hand(nil, v)
	return ok
}

func checkRecords(t *testing.T, seed uint64, extra string) (handRuns, handThreads bool) {
	t.Helper()
	f := &filler{rnd: rand.New(rand.NewPCG(seed, seed>>32)), extra: extra}
	var r Run
	f.fill(reflect.ValueOf(&r).Elem(), 0)
	var th Thread
	f.fill(reflect.ValueOf(&th).Elem(), 0)
	return checkSame(t, &r, AppendRunJSON, appendRun), checkSame(t, &th, AppendThreadJSON, appendThread)
}

func TestRecordJSONMatchesEncodingJSON(t *testing.T) {
	runs, threads := 0, 0
	const n = 20000
	for seed := range uint64(n) {
		r, th := checkRecords(t, seed, "extra \u2029 <")
		if r {
			runs++
		}
		if th {
			threads++
		}
	}
	// Random records hold odd times and metadata often; still, most must
	// go through the hand encoder, or this test proves only the fallback.
	if runs < n/20 || threads < n/4 {
		t.Fatalf("the hand encoder wrote only %d run and %d thread records of %d", runs, threads, n)
	}
	t.Logf("hand-encoded %d run and %d thread records of %d", runs, threads, n)
}

// TestRecordJSONHandEncodesEveryday: the records a run writes go through
// the hand encoder, not the fallback.
func TestRecordJSONHandEncodesEveryday(t *testing.T) {
	now := time.Now().UTC()
	cached := 3
	r := everydayRun(now, &cached)
	if _, ok := appendRun(nil, r); !ok {
		t.Fatal("a finished run's record fell back to encoding/json")
	}
	checkSame(t, r, AppendRunJSON, appendRun)
	capped := everydayRun(now, nil)
	capped.Status, capped.StopReason, capped.IncompleteDetails = StatusIncomplete, StopLoopCapped, IncompleteFor(StatusIncomplete, StopLoopCapped)
	data, ok := appendRun(nil, capped)
	if !ok {
		t.Fatal("an incomplete run's record fell back to encoding/json")
	}
	if !bytes.Contains(data, []byte(`"status":"incomplete","multitask_strategy"`)) || !bytes.Contains(data, []byte(`"stop_reason":"loop_capped","incomplete_details":{"reason":"loop_capped"}`)) {
		t.Fatalf("incomplete record: %s", data)
	}
	checkSame(t, capped, AppendRunJSON, appendRun)
	th := everydayThread(now)
	if _, ok := appendThread(nil, th); !ok {
		t.Fatal("a leased thread's record fell back to encoding/json")
	}
	checkSame(t, th, AppendThreadJSON, appendThread)
}

func everydayRun(now time.Time, cached *int) *Run {
	var u UsageTotals
	u.AddCall("gpt", PurposeMain, 10, 2, cached, false)
	usage := &RunUsage{RunID: "r1", ThreadID: "t1", Tenant: "default", Own: u, Total: u, Final: true, UpdatedAt: now}
	return &Run{
		RunID: "r1", ThreadID: "t1", Tenant: "default", Agent: "chatbot", Status: StatusSuccess,
		MultitaskStrategy: StrategyEnqueue, Attempt: 1, CreatedAt: now, StartedAt: &now, FinishedAt: &now,
		Output:   &model.Message{ID: "msg_1", Role: model.RoleAssistant, Content: "ok", Meta: map[string]any{"run_id": "r1", "usage": map[string]any{"input_tokens": json.Number("10")}}},
		Metadata: map[string]any{"n": json.Number("12345678901234567890"), "tags": []any{"a", 1.5, true, nil}},
		Usage:    usage, Worker: "w1", Epoch: 4, MsgSeq: 99, BaseCheckpoint: "cp1", Seq: 7,
	}
}

func everydayThread(now time.Time) *Thread {
	return &Thread{
		ThreadID: "t1", Tenant: "default", CreatedAt: now, UpdatedAt: now, Status: ThreadBusy, Head: "cp1", Epoch: 4,
		Lease: &Lease{RunID: "r1", Worker: "w1", Epoch: 4, MsgSeq: 99, AcquiredAt: now, RenewedAt: now,
			Attempt: 1, Agent: "chatbot", BaseCheckpoint: "cp0", CreatedAt: &now},
		Preempt:   []Preemption{{RunID: "r2", Strategy: StrategySteer}},
		LastRunID: "r0", Owner: "alice",
		LastRun: &Run{RunID: "r0", ThreadID: "t1", Tenant: "default", Agent: "chatbot", Status: StatusSuccess, Attempt: 1,
			CreatedAt: now, StartedAt: &now, FinishedAt: &now, Worker: "w1", Epoch: 3, MsgSeq: 98, Seq: 3},
	}
}

// FuzzRecordJSON: for any random run and thread record (the seed drives
// the shape, the string is one more value), the hand encoder writes what
// encoding/json writes, or fails as it fails.
func FuzzRecordJSON(f *testing.F) {
	f.Add(uint64(1), "")
	f.Add(uint64(42), "<&>\u2028")
	f.Add(uint64(7), "\xed\xa0\x80 surrogate half")
	f.Fuzz(func(t *testing.T, seed uint64, extra string) {
		checkRecords(t, seed, extra)
	})
}

// BenchmarkRecordJSON compares the hand encoder with encoding/json on
// the records a run writes. hand writes into a new buffer of the size
// internal/kv gives it, as a write does; hand-reused into one buffer,
// the encoding alone.
func BenchmarkRecordJSON(b *testing.B) {
	now := time.Now().UTC()
	cached := 3
	for _, c := range []struct {
		name string
		v    any
		size int
	}{
		{"run=pending", &Run{RunID: "r1", ThreadID: "t1", Tenant: "default", Agent: "chatbot", Status: StatusPending, CreatedAt: now, MsgSeq: 99}, 512},
		{"run=finished", everydayRun(now, &cached), 2048},
		{"thread=leased", everydayThread(now), 512},
	} {
		hand := func(buf []byte) ([]byte, error) {
			if r, ok := c.v.(*Run); ok {
				return AppendRunJSON(buf, r)
			}
			return AppendThreadJSON(buf, c.v.(*Thread))
		}
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := json.Marshal(c.v); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/hand", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := hand(make([]byte, 0, c.size)); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/hand-reused", func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 4096)
			for b.Loop() {
				var err error
				if buf, err = hand(buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestEventDataJSONMatchesEncodingJSON: the lifecycle events' data, filled
// at random, encodes by hand to what encoding/json writes, by value and by
// pointer, or falls back; everyday values go through the hand encoder.
func TestEventDataJSONMatchesEncodingJSON(t *testing.T) {
	check := func(v any) bool {
		t.Helper()
		want, wantErr := json.Marshal(v)
		got, ok := AppendEventDataJSON([]byte("prefix:"), v)
		if !ok {
			return false
		}
		if wantErr != nil {
			t.Fatalf("hand-encoded %+v, which encoding/json refuses (%v)", v, wantErr)
		}
		if !bytes.Equal(got, append([]byte("prefix:"), want...)) {
			t.Fatalf("hand-encoded event data differs from encoding/json:\n got %s\nwant prefix:%s", got, want)
		}
		return true
	}
	const n = 5000
	hand := 0
	for seed := range uint64(n) {
		f := &filler{rnd: rand.New(rand.NewPCG(seed, seed>>32)), extra: "extra \u2028 &"}
		var st StartedData
		f.fill(reflect.ValueOf(&st).Elem(), 0)
		var q QueuedData
		f.fill(reflect.ValueOf(&q).Elem(), 0)
		var fin FinishedData
		f.fill(reflect.ValueOf(&fin).Elem(), 0)
		var msg model.Message
		f.fill(reflect.ValueOf(&msg).Elem(), 0)
		var cs ContextSnapshot
		f.fill(reflect.ValueOf(&cs).Elem(), 0)
		withContext := completedMessage()
		withContext.Meta["usage"].(map[string]any)["context"] = &cs
		for _, v := range []any{st, &st, q, &q, fin, &fin, msg, &msg, withContext} {
			if check(v) {
				hand++
			}
		}
	}
	if hand < n {
		t.Fatalf("the hand encoder wrote only %d of %d event data values", hand, 6*n)
	}
	now := time.Now().UTC()
	everyday := []any{
		StartedData{Attempt: 1, Worker: "w1", Agent: "chatbot", MultitaskStrategy: StrategyEnqueue, QueuedAt: &now},
		QueuedData{Agent: "chatbot", MultitaskStrategy: StrategyEnqueue},
		FinishedData{Status: StatusSuccess, Output: everydayRun(now, nil).Output},
		FinishedData{Status: StatusIncomplete, StopReason: StopMaxSteps, IncompleteDetails: IncompleteFor(StatusIncomplete, StopMaxSteps), Output: everydayRun(now, nil).Output},
		&FinishedData{Status: StatusInterrupted, Interrupt: &Interrupt{Kind: InterruptApproval, RunID: "r1", AllowedDecisions: []string{"approve"}}},
		*everydayRun(now, nil).Output,
		everydayRun(now, nil).Output,
		completedMessage(),
	}
	for _, v := range everyday {
		if !check(v) {
			t.Fatalf("everyday event data %+v fell back to encoding/json", v)
		}
	}
	for _, v := range []any{(*StartedData)(nil), (*FinishedData)(nil), (*model.Message)(nil), map[string]any{"a": 1}, DeltaData{MessageID: "m", Delta: "d"}} {
		if _, ok := AppendEventDataJSON(nil, v); ok {
			t.Fatalf("%T was hand-encoded; it should go to encoding/json", v)
		}
	}
}

// completedMessage is an assistant message as message.completed carries
// it: meta.usage with the call's step and context (CompletedMessage).
func completedMessage() model.Message {
	return model.Message{ID: "msg_1", Role: model.RoleAssistant, Content: "ok", Meta: map[string]any{
		"finish_reason": "stop", "run_id": "r1",
		"usage": map[string]any{"input_tokens": 10, "output_tokens": 2, "approximate": true, "model": "gpt", "step": 1,
			"context": &ContextSnapshot{Encoding: "o200k_base", Tokens: 1555, SystemTokens: 142, MessagesTokens: 5, ToolsTokens: 1405,
				MessageCount: 1, ToolCount: 9, NextTokens: 1560, Window: 128000, UsageRatio: 0.012148, Remaining: 126445,
				TriggerFraction: 0.8, TriggerTokens: 102400, Pressure: 0.015234375}},
	}}
}

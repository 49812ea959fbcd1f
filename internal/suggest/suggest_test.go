package suggest

import "testing"

func TestDidYouMean(t *testing.T) {
	names := []string{"current_time", "read_file", "write_file", "loop_detection"}
	for in, want := range map[string]string{
		"current_tme":    "; did you mean current_time?",
		"writ_file":      "; did you mean write_file?",
		"loop_detektion": "; did you mean loop_detection?",
		"read_file":      "",
		"frobnicate":     "",
	} {
		if got := DidYouMean(in, names); got != want {
			t.Errorf("DidYouMean(%q) = %q, want %q", in, got, want)
		}
	}
}

package protocol

import "strings"

// RunMsgID is the Nats-Msg-Id of a run request: "<tenant>.<run>". The runs
// stream dedupes message ids over every tenant, so a bare run id would let
// one tenant's run id silently swallow another's request (the stream
// answers "duplicate" and stores nothing). Run ids are unique per tenant,
// and so is this.
func RunMsgID(tenant, run string) string { return tenant + "." + run }

// RunIDFromMsgID returns the run id of a run request's Nats-Msg-Id when it
// has the form RunMsgID(tenant, run) for the given tenant and a valid run
// id, and "" otherwise (another tenant's id, the old bare run id form, or
// garbage).
func RunIDFromMsgID(tenant, msgID string) string {
	run, ok := strings.CutPrefix(msgID, tenant+".")
	if !ok || !ValidToken(run) {
		return ""
	}
	return run
}

// CheckRunMsgID validates a run request's Nats-Msg-Id header against the
// request's tenant and run id. An empty id is allowed (the request is then
// not deduplicated).
func CheckRunMsgID(tenant, run, msgID string) error {
	if msgID == "" || msgID == RunMsgID(tenant, run) {
		return nil
	}
	return invalid("Nats-Msg-Id", "%q does not match the run: it must be %q (<tenant>.<run_id>)", clip(msgID, 300), RunMsgID(tenant, run))
}

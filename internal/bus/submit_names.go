package bus

// SubmitSubject is the submit service's subject for a thread's run
// requests. A tenant in its own NATS account publishes to
// RunSubject(tenant, thread); its service import maps that to this subject
// in the service account, where the workers' submit service (a queue
// group) stamps the principal and enqueues the request in the runs stream.
func (n Names) SubmitSubject(tenant, thread string) string {
	return n.Prefix + ".submit." + tenant + "." + thread
}

// SubmitSubjects matches every submit service request.
func (n Names) SubmitSubjects() string { return n.Prefix + ".submit.>" }

// ParseSubmitSubject returns the tokens of a submit service subject. The
// tokens are not validated.
func (n Names) ParseSubmitSubject(subject string) (tenant, thread string, ok bool) {
	return n.parsePair(subject, "submit")
}

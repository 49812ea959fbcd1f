package bus

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStartClusterChoosesNewPortsWhenOneIsTaken: a port chosen for a node
// and taken by another process before the node binds it (many servers
// starting at once on a test machine) costs a start on new ports, not a
// failed cluster.
func TestStartClusterChoosesNewPortsWhenOneIsTaken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	real, realWait := freePort, nodeReadyWait
	t.Cleanup(func() { freePort, nodeReadyWait = real, realWait })
	nodeReadyWait = 3 * time.Second
	calls := 0
	freePort = func() (int, error) {
		calls++
		if calls == 4 { // the first node's client port, after the three route ports
			return takenPort, nil
		}
		return real()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := StartCluster(ctx, ClusterConfig{Dir: t.TempDir(), Nodes: 3})
	if err != nil {
		t.Fatalf("cluster with a taken port: %v", err)
	}
	defer c.Close()
	if calls < 4 {
		t.Fatalf("freePort called %d times: the taken port was never handed out", calls)
	}
	for _, u := range c.ClientURLs() {
		if strings.HasSuffix(u, ":"+strconv.Itoa(takenPort)) {
			t.Errorf("a node listens at the taken port: %v", c.ClientURLs())
		}
	}
	if len(c.Servers()) != 3 {
		t.Errorf("%d servers running, want 3", len(c.Servers()))
	}
}

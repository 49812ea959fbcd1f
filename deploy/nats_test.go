package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// natsNodes are the compose cluster's nodes: the compose service names,
// which are also the nodes' server names and their route host names.
var natsNodes = []string{"nats-1", "nats-2", "nats-3"}

// loadNATSConf parses one node's server config with nats-server's own
// parser: a typo in a key or a bad value fails here as it would at start.
func loadNATSConf(t *testing.T, node string) *server.Options {
	t.Helper()
	o, err := server.ProcessConfigFile(filepath.Join(natsConfDir, node+".conf"))
	if err != nil {
		t.Fatalf("%s.conf: %v", node, err)
	}
	return o
}

func TestNATSConfigsFormOneCluster(t *testing.T) {
	var first *server.Options
	for _, node := range natsNodes {
		o := loadNATSConf(t, node)
		if o.ServerName != node {
			t.Errorf("%s.conf: server_name %q, want the compose service name %q", node, o.ServerName, node)
		}
		if !o.JetStream {
			t.Errorf("%s.conf: JetStream is off", node)
		}
		if o.StoreDir == "" || o.JetStreamMaxStore <= 0 {
			t.Errorf("%s.conf: JetStream needs a store_dir and a max_file_store (got %q, %d)", node, o.StoreDir, o.JetStreamMaxStore)
		}
		if o.HTTPPort <= 0 {
			t.Errorf("%s.conf: no monitoring port: the healthcheck and the lag need it", node)
		}
		if o.Cluster.Name == "" || o.Cluster.Port <= 0 {
			t.Errorf("%s.conf: cluster needs a name and a port (got %q, %d)", node, o.Cluster.Name, o.Cluster.Port)
		}
		// Each node routes to the two others, at their cluster port.
		var got []string
		for _, r := range o.Routes {
			got = append(got, r.Host)
		}
		var want []string
		for _, other := range natsNodes {
			if other != node {
				want = append(want, fmt.Sprintf("%s:%d", other, o.Cluster.Port))
			}
		}
		if !sameSet(got, want) {
			t.Errorf("%s.conf: routes %v, want %v", node, got, want)
		}
		if first == nil {
			first = o
			continue
		}
		// The nodes differ only in name and routes.
		if o.Cluster.Name != first.Cluster.Name || o.Cluster.Port != first.Cluster.Port || o.Port != first.Port ||
			o.HTTPPort != first.HTTPPort || o.StoreDir != first.StoreDir ||
			o.JetStreamMaxStore != first.JetStreamMaxStore || o.JetStreamMaxMemory != first.JetStreamMaxMemory {
			t.Errorf("%s.conf differs from %s.conf beyond server_name and routes", node, first.ServerName)
		}
	}
}

// TestComposeClusterRunsNatsagent starts the compose cluster's three nodes
// in process, from their config files (only addresses move to loopback and
// the store to a temp dir), provisions natsagent with replicas 3 as the
// compose and Kubernetes configurations say, and reads the workers' lag
// from the monitoring endpoint the way KEDA's nats-jetstream scaler does,
// with the ScaledObject's account, stream and consumer.
func TestComposeClusterRunsNatsagent(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	// The nodes' own configs; natstest moves addresses to loopback, the
	// stores to a temp dir, and gives each a monitoring port.
	c := natstest.StartClusterWith(t, bus.ClusterConfig{Nodes: len(natsNodes), Monitor: true,
		NodeOptions: func(i int) (*server.Options, error) { return loadNATSConf(t, natsNodes[i]), nil }})
	servers := c.Servers()
	urls := c.ClientURLs()
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	composeSettings := settingsOf(t, loadConfig(t, composeConfig))
	k8sSettings := settingsOf(t, loadConfigMapConfig(t))
	for _, s := range []bus.Settings{composeSettings, k8sSettings} {
		if err := bus.Provision(ctx, js, s); err != nil {
			t.Fatalf("provision with replicas %d: %v", s.Replicas, err)
		}
	}
	stream, err := js.Stream(ctx, composeSettings.Names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("runs stream: %d replicas configured, cluster %+v: want R3 on three nodes", info.Config.Replicas, info.Cluster)
	}
	kv, err := js.KeyValue(ctx, composeSettings.Names.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if st, err := kv.Status(ctx); err != nil || st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas != 3 {
		t.Fatalf("threads bucket is not R3: %v", err)
	}

	// One run waits in the queue: KEDA's lag must say 1.
	so := loadScaledObject(t)
	trig := so.Spec.Triggers[0].Metadata
	if _, err := js.Publish(ctx, k8sSettings.Names.RunSubject("default", "lag"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	testdeploy.WaitFor(t, 10*time.Second, "the consumer leader's /jsz to report a lag of 1", func() bool {
		leaders := 0
		for _, s := range servers {
			jsz, err := fetchJsz(s.MonitorAddr().String(), trig["account"])
			if err != nil {
				t.Logf("%s: %v", s.Name(), err)
				return false
			}
			if jsz.MetaCluster.ClusterSize != len(servers) {
				return false
			}
			c := jsz.consumer(trig["account"], trig["stream"], trig["consumer"])
			if c == nil || c.Cluster.Leader != s.Name() {
				continue
			}
			leaders++
			if c.NumPending+c.NumAckPending != 1 {
				return false
			}
		}
		return leaders == 1
	})
}

// jsz is the part of the monitoring endpoint's /jsz answer that KEDA's
// nats-jetstream scaler reads.
type jsz struct {
	Accounts    []jszAccount `json:"account_details"`
	MetaCluster struct {
		ClusterSize int `json:"cluster_size"`
	} `json:"meta_cluster"`
}

type jszAccount struct {
	Name    string      `json:"name"`
	Streams []jszStream `json:"stream_detail"`
}

type jszStream struct {
	Name      string        `json:"name"`
	Consumers []jszConsumer `json:"consumer_detail"`
}

type jszConsumer struct {
	Name          string `json:"name"`
	NumPending    int    `json:"num_pending"`
	NumAckPending int    `json:"num_ack_pending"`
	Cluster       struct {
		Leader string `json:"leader"`
	} `json:"cluster"`
}

func (j *jsz) consumer(account, stream, consumer string) *jszConsumer {
	for _, a := range j.Accounts {
		if a.Name != account {
			continue
		}
		for _, s := range a.Streams {
			if s.Name != stream {
				continue
			}
			for i := range s.Consumers {
				if s.Consumers[i].Name == consumer {
					return &s.Consumers[i]
				}
			}
		}
	}
	return nil
}

// fetchJsz asks a node's monitoring endpoint with the scaler's query.
func fetchJsz(addr, account string) (*jsz, error) {
	resp, err := http.Get(fmt.Sprintf("http://%s/jsz?acc=%s&consumers=true&config=true", addr, account))
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/jsz: %s", resp.Status)
	}
	var j jsz
	if err := json.NewDecoder(resp.Body).Decode(&j); err != nil {
		return nil, err
	}
	return &j, nil
}

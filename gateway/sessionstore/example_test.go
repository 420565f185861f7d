package sessionstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/sessionstore"
	"github.com/basin-dev/basin/internal/lease"
)

// A gateway replica that wins the admission lease loads the table, announces itself, makes
// each admission durable before forwarding its first call, and saves its state periodically.
func Example() {
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer func() { _ = client.Close() }()
	ctx := context.Background()

	const prefix = "basin:gateway" // the store's prefix + ":gateway"
	campaign, err := lease.New(client, lease.Options{Prefix: prefix, Owner: "gw-0"})
	if err != nil {
		panic(err)
	}
	campaign.Step(ctx) // Run(ctx) in a gateway
	epoch, ok := campaign.Leader()
	if !ok {
		panic("not leader")
	}
	store, err := sessionstore.New(client, campaign, sessionstore.Options{Prefix: prefix})
	if err != nil {
		panic(err)
	}

	// Take over: read the table (empty here) and announce the new leader.
	st, meta, err := store.Load(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("loaded", len(st.Live), "sessions, daemon term", meta.DaemonTerm)
	if err := store.SetLeader(ctx, epoch, sessionstore.LeaderInfo{ReplicaID: "gw-0", Epoch: epoch, AdminURL: "http://gw-0:8081"}); err != nil {
		panic(err)
	}

	// A session admitted by the core is durable before its first call is forwarded.
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	ls := admission.LiveSession{ID: "sess-1", Arrival: at, Admitted: at, Context: 4096, PredictedPeak: 60_000}
	if err := store.Admit(ctx, epoch, ls); err != nil {
		panic(err)
	}

	// The periodic save: the core's export, as a diff.
	st = admission.State{Budget: 500_000, ReferenceBudget: 600_000, Live: []admission.LiveSession{ls}}
	if err := store.Save(ctx, epoch, st, sessionstore.Meta{DaemonTerm: 3}); err != nil {
		panic(err)
	}

	// Another replica finds the leader and the table.
	li, err := store.Leader(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("leader", li.ReplicaID, "at", li.AdminURL)
	st, meta, err = store.Load(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("loaded", len(st.Live), "session, budget", st.Budget, "daemon term", meta.DaemonTerm)
	// Output:
	// loaded 0 sessions, daemon term 0
	// leader gw-0 at http://gw-0:8081
	// loaded 1 session, budget 500000 daemon term 3
}

package replication

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/sessionstore"
	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/internal/lease"
	"github.com/basin-dev/basin/internal/store"
)

// Timings of replicated mode that are not configuration.
const (
	// replicaTick is how often a replica heartbeats, looks up the leader and, leading, saves the
	// table.
	replicaTick = time.Second
	// replicaSeenWithin is how recent a heartbeat must be for a replica to count in the degraded
	// slice's divisor: a few ticks, so that a replica gone (a stopped one leaves at once) stops
	// counting soon. Its id is free after as long.
	replicaSeenWithin = sessionstore.ReplicaFresh
	// maxPendingOps bounds the begin/finish reports waiting for the leader; past it the oldest
	// are dropped and the sessions resynced whole at the next contact.
	maxPendingOps = 100_000
)

// Headers of replicated mode's admin traffic.
const (
	// ForwardedByHeader marks an admin request a follower forwarded to the leader, so that a
	// replica that is not (or no longer) the leader answers instead of forwarding it again.
	ForwardedByHeader = "Basin-Forwarded-By"
	// ReplicaHeader names the replica that answered an admin request.
	ReplicaHeader = "Basin-Replica"
)

// Degraded admission: what a replica does with new sessions while it cannot reach the leader or
// the store (the gateway's replication.degraded_admission).
const (
	// DegradedLocalSlice admits them against this replica's share of the budget the leader had
	// free at the last contact, divided by the number of replicas seen.
	DegradedLocalSlice = "local_slice"
	// DegradedRefuse answers them 503 (with Retry-After) until the leader is back.
	DegradedRefuse = "refuse"
)

// Table is the store the leader persists the admission table in (sessionstore.Store).
type Table interface {
	Load(ctx context.Context) (admission.State, sessionstore.Meta, error)
	Save(ctx context.Context, epoch uint64, st admission.State, m sessionstore.Meta) error
	Admit(ctx context.Context, epoch uint64, ls admission.LiveSession) error
	End(ctx context.Context, epoch uint64, ids ...string) error
	Queue(ctx context.Context, epoch uint64, id string, arrival time.Time) error
	SetLeader(ctx context.Context, epoch uint64, li sessionstore.LeaderInfo) error
	Leader(ctx context.Context) (sessionstore.LeaderInfo, error)
	Heartbeat(ctx context.Context, rp sessionstore.Replica, now time.Time) error
	Leave(ctx context.Context, rp sessionstore.Replica) error
	Replicas(ctx context.Context, since time.Time) ([]string, error)
	ReplicaURLs(ctx context.Context, since time.Time) (map[string]string, error)
}

// campaign is the admission leader's lease (lease.Campaign).
type campaign interface {
	Run(ctx context.Context) error
	Leader() (epoch uint64, ok bool)
	Release(ctx context.Context) error
}

// Host is what a replica needs of the gateway it is part of: what the gateway keeps beside the
// admission core, which the replica drives itself.
type Host interface {
	// Deliver hands the core's events to the calls waiting on them and to the gateway's
	// bookkeeping, as every change of the core's must be.
	Deliver(evs []admission.Event)
	// AskAgain wakes the waiting calls of sessions taken out of the local queue: each asks
	// again, as a call of a session that went live meanwhile would, and meets whoever decides
	// now.
	AskAgain(ids []string)
	// Admit admits a follower's first call on the leader as a call of the leader's own would
	// be, writing its refusal, if any, to w; first says the call started its session.
	Admit(w http.ResponseWriter, r *http.Request, c Call) (admitted, first bool)
	// Hold holds and resumes sessions in the local core, delivering the releases, under the
	// lock every change of the gateway's hold list takes; it returns how many it newly held.
	Hold(hold, resume []string) (added int)
	// ChainLink is the session a Responses call naming responseID continues, and its context,
	// when the gateway knows the response.
	ChainLink(responseID string) (session string, context int64, ok bool)
	// LinkChain records that a live session continues as a call naming responseID, with
	// context tokens.
	LinkChain(session, responseID string, context int64)
	// ChainLinks are every response the gateway's live sessions may be continued from.
	ChainLinks() []ChainLink
	// Settings are what the table keeps beside the sessions of the gateway's own: the affinity
	// switch and the highest daemon term accepted.
	Settings() (affinity bool, daemonTerm uint64)
	// RestoreSettings takes a loaded table's settings over: the affinity switch when it has
	// one, the daemon term when it is higher.
	RestoreSettings(affinity *bool, daemonTerm uint64)
}

// ChainLink is a response a later call may continue: the session it belongs to and that
// session's context once the response was written.
type ChainLink struct {
	Session, Response string
	Context           int64
}

// Call is a call of a session the local core does not know, as a replica asks the leader to
// admit it.
type Call struct {
	ID     string
	Tenant string
	// Anonymous: a one-call session, ended with its call; its admission is not persisted.
	Anonymous bool
	// Forwarded: a follower's first call, being admitted on the leader for it.
	Forwarded bool
	// Arrival is when the call reached the gateway: its place in time, however many leaders it
	// waits through.
	Arrival time.Time
	Req     agentcall.Call
}

// LeaderView is what a follower knows of the leader's budget from its last answer: what the
// degraded slice is cut from.
type LeaderView struct {
	CountOnly       bool  `json:"count_only"`
	Budget          int64 `json:"budget_tokens"`
	ReferenceBudget int64 `json:"reference_budget_tokens"`
	Reserved        int64 `json:"reserved_tokens"`
	Replicas        int   `json:"replicas"`
}

// Options are what a Replica is built from; New says which is missing.
type Options struct {
	// Store is the Redis or Valkey server the replicas share, its defaults filled.
	Store store.Config
	// ReplicaID names this replica to the others and in the store, unique among them.
	ReplicaID string
	// AdvertiseURL is this replica's admin listener as the other replicas reach it.
	AdvertiseURL string
	// ReportInterval is how often the calls' begins and finishes go to the leader in a batch.
	ReportInterval time.Duration
	// DegradedAdmission is DegradedLocalSlice or DegradedRefuse.
	DegradedAdmission string
	// Admission are the gateway's admission options: a leader that finds no budget in the
	// store (and has heard of none) starts from the configured one.
	Admission admission.Options
	// MaxQueueWait is how long the gateway holds a queued first call: the leader holds a
	// follower's first call as long.
	MaxQueueWait time.Duration
	// MaxBodyBytes bounds a follower's first call as the leader reads it.
	MaxBodyBytes int64
	// Token is the admin token, the same on every replica: the replicas' protocol is on the
	// admin listener, behind it.
	Token []byte
	// Transport carries the replicas' protocol and the admin requests forwarded to the leader.
	Transport *http.Transport
	// Core is the gateway's admission core: on the leader the deployment's, on a follower a
	// mirror of the sessions it serves.
	Core *admission.Core
	// Host is the gateway this replica is part of.
	Host Host
	// Logger receives the replica's changes and errors (discarded when nil).
	Logger *slog.Logger
	// Registerer is where the replication metrics are registered (a private registry when nil).
	Registerer prometheus.Registerer
	// Now is the gateway's clock (time.Now when nil).
	Now func() time.Time
	// Getenv reads the environment (os.Getenv when nil): the store's password may be there.
	Getenv func(string) string
}

// validate fills the defaults and says which required option is missing.
func (o *Options) validate() error {
	switch {
	case !o.Store.Enabled():
		return errors.New("replication: options: Store needs a URL")
	case o.ReplicaID == "":
		return errors.New("replication: options: ReplicaID is required")
	case o.AdvertiseURL == "":
		return errors.New("replication: options: AdvertiseURL is required")
	case o.ReportInterval <= 0:
		return errors.New("replication: options: ReportInterval must be > 0")
	case o.DegradedAdmission != DegradedLocalSlice && o.DegradedAdmission != DegradedRefuse:
		return fmt.Errorf("replication: options: DegradedAdmission: want %s or %s, got %q", DegradedLocalSlice, DegradedRefuse, o.DegradedAdmission)
	case o.Transport == nil:
		return errors.New("replication: options: Transport is required")
	case o.Core == nil:
		return errors.New("replication: options: Core is required")
	case o.Host == nil:
		return errors.New("replication: options: Host is required")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	return nil
}

// Replica is one gateway's part in replicated mode.
type Replica struct {
	id string
	// instance tells this process from another started with the same id (sessionstore.Replica).
	instance  string
	advertise string
	// fatal receives the error this replica cannot run on (its id in use by another running
	// replica); the gateway's Run stops with it.
	fatal     chan error
	cfg       Options
	opTimeout time.Duration
	leaseTTL  time.Duration
	core      *admission.Core
	host      Host
	now       func() time.Time
	// log names this replica on every line; gatewayLog is the gateway's own, for the lines the
	// gateway logged before replication was a package of its own.
	log        *slog.Logger
	gatewayLog *slog.Logger
	table      Table
	lease      campaign
	closeFn    func() error
	http       *http.Client
	changes    chan lease.Change
	metrics    replicaMetrics
	// flush asks the report loop to send now: a session's end is not left waiting for the
	// next tick, so a replica that dies right after leaves no ended session live at the leader.
	flush chan struct{}

	// leading is the epoch this replica leads in, set once the table is loaded and merged; 0
	// while following. Leading also needs the lease still valid (lease.Leader), which a paused
	// process loses at its deadline without having run a line.
	leading atomic.Uint64

	mu struct {
		sync.Mutex
		leader sessionstore.LeaderInfo
		// leaderGone is closed when the leader changes: first calls held by the old one retry.
		leaderGone chan struct{}
		degraded   string // why; "" when the leader answers
		// synced is the leader epoch the unacknowledged sessions were last reported to.
		synced uint64
		ops    []reportOp
		// alone are the sessions admitted here that no leader knows of (admittedAlone).
		alone map[string]struct{}
		// endedSinceSave are the sessions that ended here while leading since the last save
		// began: if this replica stops leading before a save covers them, it reports their
		// ends to the next leader, which may have loaded them live.
		endedSinceSave []string
		view           LeaderView
		seen           int // replicas with a recent heartbeat
		// answered is when the leader last answered this replica (a report or a first call).
		answered time.Time
		// known is this replica's copy of the leader's live set.
		known knownLive
		// ended is, on the leader, when each session that recently ended (here, or reported
		// ended by a replica) did: a report of the session as live that is older than its
		// end does not bring it back (notEnded).
		ended map[string]time.Time
	}
}

type replicaMetrics struct {
	leader, degraded prometheus.Gauge
	rpc              *prometheus.HistogramVec
	rpcErrors        *prometheus.CounterVec
	degradedAdmits   prometheus.Counter
	knownPassed      prometheus.Counter
	changes          prometheus.Counter
}

func newReplicaMetrics(reg prometheus.Registerer) (replicaMetrics, error) {
	m := replicaMetrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "basin_gateway_replication_leader",
			Help: "1 on the replica that is the admission leader (it alone exports the deployment's admission gauges)."}),
		degraded: prometheus.NewGauge(prometheus.GaugeOpts{Name: "basin_gateway_replication_degraded",
			Help: "1 while this replica cannot reach the admission leader or the store: live calls pass, new sessions use the local slice (or are refused)."}),
		rpc: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "basin_gateway_replication_rpc_seconds",
			Help:    "Round trips to the admission leader: a first call's admission (queueing included), the batched reports, and the look-up of a Responses chain's response.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 18)}, []string{"op"}),
		rpcErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "basin_gateway_replication_rpc_errors_total",
			Help: "Round trips to the admission leader that failed (unreachable, not the leader, or an error answer)."}, []string{"op"}),
		degradedAdmits: prometheus.NewCounter(prometheus.CounterOpts{Name: "basin_gateway_replication_degraded_admissions_total",
			Help: "Sessions this replica admitted against its local slice while degraded."}),
		knownPassed: prometheus.NewCounter(prometheus.CounterOpts{Name: "basin_gateway_replication_known_live_passed_total",
			Help: "Sessions this replica had not served whose calls it passed while no leader answered, because they were live at the leader at its last contact."}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{Name: "basin_gateway_replication_leader_changes_total",
			Help: "Times this replica became or stopped being the admission leader."}),
	}
	for _, c := range []prometheus.Collector{m.leader, m.degraded, m.rpc, m.rpcErrors, m.degradedAdmits, m.knownPassed, m.changes} {
		if err := reg.Register(c); err != nil {
			return m, err
		}
	}
	for _, op := range []string{"arrive", "report", "chain"} {
		m.rpcErrors.WithLabelValues(op)
	}
	return m, nil
}

// New connects replicated mode: the store client (lazily, so a replica starts and serves
// degraded while the store is down), the session table and the lease.
func New(o Options) (*Replica, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	client, err := store.OpenLazy(o.Store, o.Getenv)
	if err != nil {
		return nil, err
	}
	r := &Replica{id: o.ReplicaID, instance: newInstance(), advertise: o.AdvertiseURL, cfg: o, fatal: make(chan error, 1),
		opTimeout: time.Duration(o.Store.OpTimeout), leaseTTL: time.Duration(o.Store.LeaseTTL),
		core: o.Core, host: o.Host, now: o.Now, log: o.Logger.With("replica", o.ReplicaID), gatewayLog: o.Logger,
		closeFn: client.Close, changes: make(chan lease.Change, 16), flush: make(chan struct{}, 1),
		http: &http.Client{Transport: o.Transport}}
	r.mu.leaderGone = make(chan struct{})
	r.mu.alone = map[string]struct{}{}
	r.mu.ended = map[string]time.Time{}
	prefix := o.Store.Prefix + ":gateway"
	camp, err := lease.New(client, lease.Options{Prefix: prefix, Owner: o.ReplicaID + "/" + strconv.Itoa(os.Getpid()),
		TTL: r.leaseTTL, Logger: o.Logger, Registerer: o.Registerer, Now: o.Now,
		OnChange: func(ch lease.Change) { r.changes <- ch }})
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	tbl, err := sessionstore.New(client, camp, sessionstore.Options{Prefix: prefix, Logger: o.Logger, Registerer: o.Registerer, Now: o.Now})
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	r.table, r.lease = tbl, camp
	if r.metrics, err = newReplicaMetrics(o.Registerer); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return r, nil
}

// WrapTable puts wrap around the session table before Run: a fault between this replica and
// its store, in a test.
func (r *Replica) WrapTable(wrap func(Table) Table) { r.table = wrap(r.table) }

// LeaderView is what this replica knows of the leader's budget: from the leader's last answer,
// or its own table when it led last.
func (r *Replica) LeaderView() LeaderView {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.view
}

// newInstance is a random token naming this process among those with the same replica id.
func newInstance() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// self is this replica as the store knows it.
func (r *Replica) self() sessionstore.Replica {
	return sessionstore.Replica{ID: r.id, Instance: r.instance, AdvertiseURL: r.advertise}
}

// Claim heartbeats once before the gateway serves: a replica id another running replica holds
// is refused at start, naming that replica. A store that cannot be reached now does not stop the
// start (the replica serves degraded); the first heartbeat that reaches it claims the id then,
// and a refusal stops the gateway (fail).
func (r *Replica) Claim(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	err := r.table.Heartbeat(ctx, r.self(), r.now())
	if inUse := replicaIDInUse(err); inUse != nil {
		return inUse
	}
	if err != nil {
		r.log.Warn("the store cannot be reached at start: serving degraded until it can", "err", err)
	}
	return nil
}

// replicaIDInUse is err as the operator's error when it says another running replica holds this
// replica's id; nil otherwise.
func replicaIDInUse(err error) error {
	var inUse *sessionstore.ReplicaIDInUseError
	if !errors.As(err, &inUse) {
		return nil
	}
	return fmt.Errorf("replication.replica_id %q is already used by the running replica advertised at %s "+
		"(its last heartbeat %s): give every replica its own replica_id — the default, the host name, is the "+
		"same for every replica on one host", inUse.ReplicaID, inUse.Other.AdvertiseURL, inUse.LastSeen.UTC().Format(time.RFC3339))
}

// Fatal delivers the error this replica cannot run on (its id in use by another running
// replica); the gateway's Run stops with it.
func (r *Replica) Fatal() <-chan error { return r.fatal }

// Rounds: every change of leader and every end of a degraded spell sends a held call round
// again, so a call gets more rounds than alone.
func (r *Replica) Rounds() int { return 32 }

// Leads reports whether this replica is the admission leader: its core is the deployment's.
func (r *Replica) Leads() bool {
	_, ok := r.isLeading()
	return ok
}

// SessionArrival is a session's arrival at the deployment, its call's, whichever replica holds
// the call and however often the leader changes while it waits.
func (r *Replica) SessionArrival(callArrival time.Time) time.Time { return callArrival }

// Admitted records a session the local core admitted. Unless this replica leads, it admitted
// it alone (degraded): the next leader reached takes it as live.
func (r *Replica) Admitted(id string) {
	if _, leading := r.isLeading(); leading {
		return
	}
	r.admittedAlone(id)
	r.metrics.degradedAdmits.Inc()
	snap := r.core.Snapshot(r.now(), false)
	r.gatewayLog.Info("session admitted alone (degraded)", "session", id, "local_budget_tokens", snap.Budget,
		"local_reserved_tokens", snap.Reserved, "local_live_sessions", snap.Live)
}

// fail stops the gateway with err (the gateway's Run returns it).
func (r *Replica) fail(err error) {
	r.log.Error("stopping this gateway replica", "err", err)
	select {
	case r.fatal <- err:
	default:
	}
}

// isLeading reports the epoch this replica leads in, if it does.
func (r *Replica) isLeading() (uint64, bool) {
	e := r.leading.Load()
	if e == 0 {
		return 0, false
	}
	le, ok := r.lease.Leader()
	return e, ok && le == e
}

// Run campaigns, follows the leadership and does the periodic work until ctx is done; then it
// saves the table a last time and releases the lease so a successor takes over at once.
func (r *Replica) Run(ctx context.Context) {
	// The campaign stops only once the last save is written: it releases the lease as it
	// returns (lease.Campaign.Run), so a campaign stopped with ctx could release before the save
	// and leave it unwritten, and a second Release here would find the lease gone and warn.
	leaseCtx, stopLease := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLease()
	var leaseDone sync.WaitGroup
	leaseDone.Go(func() {
		if err := r.lease.Run(leaseCtx); err != nil && !errors.Is(err, context.Canceled) {
			r.log.Error("admission lease", "err", err)
		}
	})
	var wg sync.WaitGroup
	wg.Go(func() { r.reportLoop(ctx) })
	tick := time.NewTicker(replicaTick)
	defer tick.Stop()
	r.tick(ctx)
	for {
		select {
		case <-ctx.Done():
			epoch, leading := r.isLeading()
			if leading {
				// A last save, so a successor starts from the calls that finished during the
				// shutdown.
				sctx, cancel := context.WithTimeout(context.Background(), 10*r.opTimeout)
				if err := r.save(sctx, epoch); err != nil {
					r.log.Error("saving the session table at shutdown", "err", err)
				}
				cancel()
			}
			r.stepDown("shutting down")
			wg.Wait()
			// Released once, by the campaign as it returns.
			stopLease()
			leaseDone.Wait()
			// Gone from the replicas seen, and its id free, at once.
			lctx, cancel := context.WithTimeout(context.Background(), r.opTimeout)
			if err := r.table.Leave(lctx, r.self()); err != nil {
				r.log.Warn("leaving the replicas seen; the others count this replica until its heartbeat is stale", "err", err)
			}
			cancel()
			_ = r.closeFn()
			return
		case ch := <-r.changes:
			r.metrics.changes.Inc()
			if ch.Leader {
				r.lead(ctx, ch.Epoch)
			} else {
				r.stepDown(ch.Reason)
			}
		case <-tick.C:
			r.tick(ctx)
		}
	}
}

// lead takes over as admission leader in epoch: load the persisted table, merge it into the
// local core (whose sessions, served here, stay live), persist the result and announce this
// replica's admin URL. Only then does it admit.
func (r *Replica) lead(ctx context.Context, epoch uint64) {
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, 10*r.opTimeout)
	defer cancel()
	st, meta, err := r.table.Load(lctx)
	if err != nil {
		r.log.Error("loading the session table; giving the lease up", "epoch", epoch, "err", err)
		_ = r.lease.Release(lctx)
		return
	}
	now := r.now()
	if st.Budget == 0 && !st.CountOnly {
		// No budget in the store (a first leader, or a store that lost its data): the budget
		// the last leader had, else the configured one — never the degraded slice this
		// replica's own core may hold.
		st.CountOnly, st.Budget, st.ReferenceBudget = r.cfg.Admission.CountOnly, r.cfg.Admission.Budget, r.cfg.Admission.ReferenceBudget
		r.mu.Lock()
		if v := r.mu.view; v.Budget > 0 || v.CountOnly {
			st.CountOnly, st.Budget, st.ReferenceBudget = v.CountOnly, v.Budget, v.ReferenceBudget
		}
		r.mu.Unlock()
		if st.ReferenceBudget == 0 {
			st.ReferenceBudget = st.Budget
		}
	}
	// Sessions queued here while degraded are decided again against the table, once it is
	// loaded: taken out now, so that dropping the sessions that ended elsewhere below admits
	// none of them against the degraded slice.
	requeued := r.core.CancelAll(now)
	// The local core mirrors the sessions this replica served, and learns of the ends of only
	// those that ended here. The table is the truth (every admission is persisted before its
	// first call goes): of the local sessions it lacks, keep only those admitted here alone;
	// the rest ended elsewhere.
	inTable := make(map[string]bool, len(st.Live))
	for _, ls := range st.Live {
		inTable[ls.ID] = true
	}
	r.mu.Lock()
	alone := maps.Clone(r.mu.alone)
	r.mu.Unlock()
	var evs []admission.Event
	dropped := 0
	for _, ls := range r.core.Export(now).Live {
		if _, mine := alone[ls.ID]; !inTable[ls.ID] && !mine {
			evs = append(evs, r.core.End(now, ls.ID)...)
			dropped++
		}
	}
	merged, err := r.core.Merge(now, st)
	evs = append(evs, merged...)
	if err != nil {
		r.log.Error("merging the session table; giving the lease up", "epoch", epoch, "err", err)
		_ = r.lease.Release(lctx)
		return
	}
	// The table's hold list is the last leader's (saved before each change was answered); this
	// replica's copy of it may be a report behind. Merge keeps a local session's hold, so the
	// table's is set here.
	var hold, resume []string
	for _, ls := range st.Live {
		if ls.Held {
			hold = append(hold, ls.ID)
		} else {
			resume = append(resume, ls.ID)
		}
	}
	r.core.Hold(now, hold)
	evs = append(evs, r.core.Resume(now, resume)...)
	r.host.RestoreSettings(meta.Affinity, meta.DaemonTerm)
	if err := r.table.Save(lctx, epoch, r.core.Export(now), r.meta()); err != nil {
		r.log.Error("saving the merged session table; giving the lease up", "epoch", epoch, "err", err)
		_ = r.lease.Release(lctx)
		return
	}
	// What this replica had not yet reported to the old leader applies here: a session that
	// ended on this replica while the old leader was unreachable would otherwise be live in
	// the table it loaded.
	r.mu.Lock()
	ops := r.mu.ops
	r.mu.ops, r.mu.alone, r.mu.synced = nil, map[string]struct{}{}, epoch
	r.mu.Unlock()
	for _, op := range ops {
		switch op.Op {
		case repFinish:
			evs = append(evs, r.core.Finish(now, op.ID, op.Tokens)...)
		case repEnd:
			evs = append(evs, r.core.End(now, op.ID)...)
		}
	}
	r.leading.Store(epoch)
	r.metrics.leader.Set(1)
	r.setDegraded("")
	r.host.Deliver(evs)
	// Announced only once it admits: a follower that reads the announcement and asks at once
	// must not be told "not the leader" by the leader it was sent to.
	if err := r.table.SetLeader(lctx, epoch, sessionstore.LeaderInfo{ReplicaID: r.id, Epoch: epoch, AdminURL: r.advertise}); err != nil {
		r.log.Error("announcing the leader; giving the lease up", "epoch", epoch, "err", err)
		r.stepDown("could not announce itself as the leader")
		r.askAgain(requeued)
		_ = r.lease.Release(lctx)
		return
	}
	r.askAgain(requeued)
	r.announce(ctx, epoch)
	snap := r.core.Snapshot(now, false)
	r.log.Info("admission leader", "epoch", epoch, "live_sessions", snap.Live, "working_set_tokens", snap.WorkingSet,
		"budget_tokens", snap.Budget, "loaded_sessions", len(st.Live), "dropped_ended_elsewhere", dropped, "took", time.Since(start).Round(time.Millisecond))
}

// stepDown stops leading: queued first calls held here — this replica's own and the followers'
// — are sent back to ask the new leader, which knows their arrival from the persisted table.
func (r *Replica) stepDown(why string) {
	epoch := r.leading.Swap(0)
	if epoch == 0 {
		return
	}
	r.metrics.leader.Set(0)
	r.knowOwn(epoch)
	r.log.Warn("no longer the admission leader", "reason", why)
	r.viewOwn() // the slice, should it be degraded next, is cut from this table, not an old answer
	r.mu.Lock()
	ends := make([]reportOp, 0, len(r.mu.endedSinceSave))
	for _, id := range r.mu.endedSinceSave {
		ends = append(ends, reportOp{Op: repEnd, ID: id})
	}
	r.mu.ops = append(ends, r.mu.ops...)
	r.mu.endedSinceSave = nil
	r.mu.synced = 0
	r.mu.Unlock()
	r.requeueElsewhere()
}

// requeueElsewhere takes every queued session out of the local core and wakes its waiting calls
// to ask again (as a call of a session that went live meanwhile would): on a replica that stopped
// leading, or a degraded one that reached a leader again.
func (r *Replica) requeueElsewhere() {
	r.askAgain(r.core.CancelAll(r.now()))
}

// askAgain wakes the waiting calls of sessions taken out of the local queue: each asks again,
// as a call of a session that went live meanwhile would, and meets whoever decides now.
func (r *Replica) askAgain(ids []string) { r.host.AskAgain(ids) }

// tick heartbeats, saves the table when leading and looks the leader up when following.
func (r *Replica) tick(ctx context.Context) {
	now := r.now()
	tctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	storeErr := r.table.Heartbeat(tctx, r.self(), now)
	if inUse := replicaIDInUse(storeErr); inUse != nil {
		// Another process runs under this id (it started while this one could not reach the
		// store, or this one was stopped past ReplicaFresh): two replicas with one id take each
		// other's leadership for their own, so this one stops, naming the other.
		r.fail(inUse)
		return
	}
	if storeErr == nil {
		if ids, err := r.table.Replicas(tctx, now.Add(-replicaSeenWithin)); err == nil {
			r.mu.Lock()
			r.mu.seen = max(1, len(ids))
			r.mu.Unlock()
		}
	}
	if epoch, ok := r.isLeading(); ok {
		r.viewOwn()
		r.forgetEnds(now)
		sctx, scancel := context.WithTimeout(ctx, 10*r.opTimeout)
		err := r.save(sctx, epoch)
		scancel()
		if errors.Is(err, lease.ErrFenced) {
			r.stepDown("a later leader holds the table")
		} else if err != nil {
			r.log.Error("saving the session table", "err", err)
		}
		return
	}
	// A follower whose leader answers is not degraded by the store alone: the leader decides
	// until its lease lapses, and then says it no longer leads. Marking it degraded here, and
	// clearing that at the next answer, would make it flap between the leader's budget and
	// its own slice, and send its queued calls round again at every flap.
	storeDown := func(err error) {
		if !r.leaderAnsweredWithin(r.leaseTTL) {
			r.setDegraded("store unreachable: " + err.Error())
		}
	}
	if storeErr != nil {
		storeDown(storeErr)
	}
	li, err := r.table.Leader(tctx)
	switch {
	case errors.Is(err, sessionstore.ErrNoLeader):
		r.setDegraded("no admission leader")
	case err != nil:
		storeDown(err)
	default:
		r.setLeader(li)
	}
}

// answeredByLeader records that the leader answered this replica: it is reachable.
func (r *Replica) answeredByLeader() {
	r.mu.Lock()
	r.mu.answered = time.Now()
	r.mu.Unlock()
	r.setDegraded("")
}

// leaderAnsweredWithin reports whether the leader answered this replica within d.
func (r *Replica) leaderAnsweredWithin(d time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.mu.answered.IsZero() && time.Since(r.mu.answered) < d
}

// meta is what the table keeps beside the sessions.
func (r *Replica) meta() sessionstore.Meta {
	aff, term := r.host.Settings()
	snap := r.core.Snapshot(r.now(), false)
	return sessionstore.Meta{CountOnly: snap.CountOnly, Budget: snap.Budget, ReferenceBudget: snap.ReferenceBudget,
		DaemonTerm: term, Affinity: &aff}
}

// setLeader records the leader read from the store; a change sends first calls held by the old
// one to the new one.
func (r *Replica) setLeader(li sessionstore.LeaderInfo) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if li == r.mu.leader {
		return
	}
	if r.mu.leader.Epoch != 0 {
		r.log.Info("admission leader changed", "leader", li.ReplicaID, "epoch", li.Epoch)
	}
	r.mu.leader = li
	close(r.mu.leaderGone)
	r.mu.leaderGone = make(chan struct{})
}

// currentLeader is the leader to ask, if one is known and is not this replica.
func (r *Replica) currentLeader() (sessionstore.LeaderInfo, <-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	li := r.mu.leader
	return li, r.mu.leaderGone, li.Epoch != 0 && li.AdminURL != "" && li.ReplicaID != r.id
}

// setDegraded enters (why non-empty) or leaves degraded mode. Entering it cuts the local slice;
// leaving it sends the sessions admitted alone to the leader (at the next report) and the
// sessions still queued here to ask it.
func (r *Replica) setDegraded(why string) {
	if _, leading := r.isLeading(); leading && why != "" {
		return // a follower's call that failed just before this replica took over
	}
	r.mu.Lock()
	was := r.mu.degraded
	r.mu.degraded = why
	view, seen := r.mu.view, r.mu.seen
	r.mu.Unlock()
	switch {
	case why != "" && was == "":
		r.metrics.degraded.Set(1)
		r.log.Warn("degraded: live sessions pass, new sessions "+r.degradedPolicy(), "reason", why)
		r.cutSlice(view, seen)
	case why == "" && was != "":
		r.metrics.degraded.Set(0)
		r.log.Info("leader reachable again: no longer degraded")
		r.host.Deliver(r.core.SetAllowance(r.now(), -1))
		r.requeueElsewhere()
	}
}

func (r *Replica) degradedPolicy() string {
	if r.cfg.DegradedAdmission == DegradedRefuse {
		return "refused"
	}
	return "admitted against the local slice"
}

// degradedReason is why this replica is degraded, "" when it is not.
func (r *Replica) degradedReason() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.degraded
}

// cutSlice sets the local core's budget for degraded admission: the sessions it already serves,
// plus its share of what the leader had free at the last contact. All replicas degraded at once
// admit at most the free budget between them, so the budget holds through a store outage; a
// replica that never heard from a leader has no free budget to share and admits only when
// nothing is live here (the core's progress rule).
func (r *Replica) cutSlice(v LeaderView, seen int) {
	if v.CountOnly {
		return // no budget yet anywhere: the local core counts only as well
	}
	snap := r.core.Snapshot(r.now(), false)
	free := max(0, v.Budget-v.Reserved)
	share := free / int64(max(1, seen))
	slice := snap.Reserved + share
	// The share is an allowance as well as budget: the local core counts sessions that passed
	// through here and live, or ended, elsewhere; as they idle out here their room would open
	// for new sessions the deployment has no room for (2 × B in the fault test on a loaded
	// machine, before).
	r.host.Deliver(r.core.SetAllowance(r.now(), share))
	evs, err := r.core.SetBudget(r.now(), max(1, slice), max(1, slice))
	if err != nil {
		r.log.Error("setting the degraded slice", "err", err)
		return
	}
	r.log.Info("degraded slice cut", "slice_tokens", slice, "local_reserved_tokens", snap.Reserved,
		"leader_budget_tokens", v.Budget, "leader_reserved_tokens", v.Reserved, "replicas_seen", seen)
	r.host.Deliver(evs)
}

// SaveNow persists the table at once when leading: an admin change is answered once durable.
func (r *Replica) SaveNow(what string) {
	epoch, ok := r.isLeading()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*r.opTimeout)
	defer cancel()
	if err := r.save(ctx, epoch); err != nil {
		r.log.Error("saving an admin change; it is kept with the next save", "change", what, "err", err)
	}
}

// save writes the table as the local core holds it now; the ends it covers need no report to a
// successor.
func (r *Replica) save(ctx context.Context, epoch uint64) error {
	r.mu.Lock()
	covered := len(r.mu.endedSinceSave)
	// On the leader, alone holds the admissions it could not write (persistAdmit): once a
	// save has written them, no successor needs them reported.
	unwritten := slices.Collect(maps.Keys(r.mu.alone))
	r.mu.Unlock()
	err := r.table.Save(ctx, epoch, r.core.Export(r.now()), r.meta())
	if err == nil {
		r.mu.Lock()
		if covered <= len(r.mu.endedSinceSave) {
			r.mu.endedSinceSave = r.mu.endedSinceSave[covered:]
		}
		for _, id := range unwritten {
			delete(r.mu.alone, id)
		}
		r.mu.Unlock()
	}
	return err
}

// endedAt records, on the leader, that session id ended at t.
func (r *Replica) endedAt(id string, t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.mu.ended[id]; !ok || t.After(prev) {
		r.mu.ended[id] = t
	}
}

// notEnded is the sessions a replica reported as live less those that ended after their
// admission there: a replica that admitted or served a session while cut off can report it
// after another replica reported its end, and taking it as live again would hold its budget
// until its idle timeout. A session admitted after an end of the same id is a new one and
// stays.
func (r *Replica) notEnded(sessions []admission.LiveSession) []admission.LiveSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.DeleteFunc(slices.Clone(sessions), func(ls admission.LiveSession) bool {
		at, ok := r.mu.ended[ls.ID]
		return ok && !at.Before(ls.Admitted)
	})
}

// forgetEnds drops the ends older than the idle timeout: a session reported live with no call
// since then is ended by the idle sweep anyway.
func (r *Replica) forgetEnds(now time.Time) {
	cutoff := now.Add(-r.core.IdleTimeout())
	r.mu.Lock()
	defer r.mu.Unlock()
	maps.DeleteFunc(r.mu.ended, func(_ string, at time.Time) bool { return at.Before(cutoff) })
}

// SessionEnded deletes a session that ended on the leader from the table without waiting for the next
// save (group-committed with the admissions), so that a successor taking over within the second
// does not load it live. Best effort: the next save deletes it anyway.
func (r *Replica) SessionEnded(id string) {
	epoch, ok := r.isLeading()
	if !ok {
		return
	}
	r.endedAt(id, r.now())
	r.mu.Lock()
	r.mu.endedSinceSave = append(r.mu.endedSinceSave, id)
	r.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), r.opTimeout)
		defer cancel()
		_ = r.table.End(ctx, epoch, id)
	}()
}

// viewOwn takes the leader's view of the budget from this replica's own table, as a follower
// takes it from the leader's answers.
func (r *Replica) viewOwn() {
	snap := r.core.Snapshot(r.now(), false)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.view = LeaderView{CountOnly: snap.CountOnly, Budget: snap.Budget, ReferenceBudget: snap.ReferenceBudget,
		Reserved: snap.Reserved, Replicas: r.mu.seen}
}

// Queued records a session queued at the leader with its arrival (group-committed): a
// successor that takes over before the next save still gives it its place in time when its
// client, cut off with this leader, asks again. Best effort, as ended.
func (r *Replica) Queued(id string, arrival time.Time) {
	epoch, ok := r.isLeading()
	if !ok {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), r.opTimeout)
		defer cancel()
		_ = r.table.Queue(ctx, epoch, id, arrival)
	}()
}

// Deciding reports whether this replica's own core may admit: it leads, or it is degraded.
func (r *Replica) Deciding() bool {
	if _, ok := r.isLeading(); ok {
		return true
	}
	return r.degradedReason() != ""
}

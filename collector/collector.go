package collector

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Collector scrapes targets and derives signals. All methods are safe for concurrent use.
type Collector struct {
	opts       Options
	log        *slog.Logger
	metrics    *metrics
	staleAfter time.Duration
	// speed is the speed of the clock Now reads (1 for the wall clock): a scraped engine that
	// announces another one is refused (checkSpeed).
	speed   float64
	running atomic.Bool

	mu struct {
		sync.Mutex
		// static are Options.Targets, file the target file's, pushed those first seen by Ingest.
		static, file []Target
		pushed       map[string]Target
		// fileStamp is the version of the target file last looked at; fileProblem the last
		// problem reported about it (each distinct problem is reported once).
		fileStamp   fileStamp
		fileProblem string

		targets map[string]*targetState
		order   []string // target names, sorted
		// values are the signals as last computed (without State).
		values   map[Signal]Value
		declared map[Signal][]string
		// affinity is whether the gateway last said sticky decode routing is on.
		affinity bool
		// cacheRestart is the last time a prefill-side instance's prefix-cache counters went
		// back (see Snapshot.CacheRestart).
		cacheRestart time.Time
	}
}

// windowRate is a target's rate over its window.
type windowRate struct {
	r  [2]float64
	ok bool
}

// targetState is what the collector keeps per target.
type targetState struct {
	target Target
	// last is the latest successful reading; nil until the first.
	last *reading

	// hitFams are the windows of the prompt-token counter families the target exports, in
	// order of preference; hitFlat is the preferred family while it stands still and another
	// advances (empty otherwise), for the log and basin_counter_family_flat.
	hitFams                   []*hitFamily
	hitFlat, hitUsed          string
	callWin, arrWin, complWin counterWindow
	ttftWin                   histWindow
	// Rates and the TTFT delta over the windows, as of the latest reading.
	hit, calls, arrivals, completions windowRate
	ttftDelta                         hist
	ttftOK                            bool

	failing bool // the latest scrape failed (for logging transitions only)
}

// decodeInstance is a decode target's KV as of now. With sticky routing (affinity) its retained
// radix KV counts as lent, as it does in the pool's cache capacity.
func (ts *targetState) decodeInstance(now time.Time, staleAfter time.Duration, affinity bool) DecodeInstance {
	d := DecodeInstance{Name: ts.target.Name}
	r := ts.last
	if r == nil {
		return d // Missing
	}
	d.At, d.State = r.at, OK
	if now.Sub(r.at) > staleAfter {
		d.State = Stale
	}
	d.Complete = r.capacity.ok && r.available.ok && r.used.ok
	d.CapacityTokens, d.FreeTokens, d.ReservedTokens = r.capacity.v, r.available.v, r.used.v
	switch {
	case r.lent.ok:
		d.LentTokens = r.lent.v
	case affinity && r.evictable.ok:
		d.LentTokens = r.evictable.v
	}
	if r.prealloc.ok {
		d.Waiting = int(r.prealloc.v)
	}
	return d
}

// prefillInstance is a prefill target's prefix cache as of now.
func (ts *targetState) prefillInstance(now time.Time, staleAfter time.Duration) PrefillInstance {
	p := PrefillInstance{Name: ts.target.Name}
	r := ts.last
	if r == nil {
		return p // Missing
	}
	p.At, p.State = r.at, OK
	if now.Sub(r.at) > staleAfter {
		p.State = Stale
	}
	p.Complete = r.capacity.ok
	p.CacheTokens = r.capacity.v
	if r.hostCapacity.ok {
		p.HostTokens = r.hostCapacity.v
	}
	return p
}

// New checks the options, reads the target file if any and registers the metrics. It starts
// nothing: call Run to scrape, or feed readings through Ingest.
func New(o Options) (*Collector, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("collector: options: %w", err)
	}
	o = o.withDefaults()
	c := &Collector{opts: o, log: o.Logger, staleAfter: time.Duration(o.StaleAfter) * o.Interval, speed: o.clockSpeed()}
	c.mu.static = o.Targets
	c.mu.pushed = map[string]Target{}
	c.mu.targets = map[string]*targetState{}
	c.mu.values = map[Signal]Value{}
	c.mu.declared = map[Signal][]string{}
	m, err := newMetrics(c, o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("collector: %w", err)
	}
	c.metrics = m
	if o.TargetFile != "" {
		stamp, err := statTargetFile(o.TargetFile)
		if err != nil {
			return nil, fmt.Errorf("collector: options: TargetFile: %w", err)
		}
		file, err := loadTargetFile(o.TargetFile)
		if err == nil {
			err = conflicts(o.Targets, file)
		}
		if err != nil {
			return nil, fmt.Errorf("collector: options: TargetFile: %w", err)
		}
		c.mu.file, c.mu.fileStamp = file, stamp
	}
	c.mu.Lock()
	c.setTargetsLocked()
	c.mu.Unlock()
	return c, nil
}

// conflicts reports file targets whose names are taken by static ones.
func conflicts(static, file []Target) error {
	var errs []error
	for _, f := range file {
		for _, s := range static {
			if s.Name == f.Name {
				errs = append(errs, fmt.Errorf("target %q: name already used by a configured target", f.Name))
			}
		}
	}
	return errors.Join(errs...)
}

// Declare records that consumer needs signals; Check and the README call the union of all
// declarations what the collector must provide. Unknown signals are an error.
func (c *Collector) Declare(consumer string, signals ...Signal) error {
	if consumer == "" {
		return errors.New("collector: declare: consumer name is empty")
	}
	for _, s := range signals {
		if !s.Valid() {
			return fmt.Errorf("collector: declare %s: unknown signal %q", consumer, s)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range signals {
		if !slices.Contains(c.mu.declared[s], consumer) {
			c.mu.declared[s] = append(c.mu.declared[s], consumer)
		}
	}
	return nil
}

// Problem is a declared signal the configured targets cannot provide (or only estimate).
type Problem struct {
	Signal Signal
	// Consumers are the declarers of the signal, in declaration order.
	Consumers []string
	// Estimated is true when the signal will be provided, but only estimated.
	Estimated bool
	Reason    string
}

// String reads like "hit_rate (needed by detector): missing: no prefill or unified target".
func (p Problem) String() string {
	kind := "missing"
	if p.Estimated {
		kind = "only estimated"
	}
	return fmt.Sprintf("%s (needed by %s): %s: %s", p.Signal, strings.Join(p.Consumers, ", "), kind, p.Reason)
}

// Check reports the declared signals that no configured target can ever provide, or only
// estimate, judging by roles and dialects alone (an auto target may be any dialect that fits
// its role). It does not scrape: whether an engine really exposes a metric shows later as the
// signal's state.
func (c *Collector) Check() []Problem {
	c.mu.Lock()
	defer c.mu.Unlock()
	exact, estimated := map[Signal]bool{}, map[Signal]bool{}
	for _, ts := range c.mu.targets {
		for _, s := range provides(ts.target, false) {
			exact[s] = true
		}
		for _, s := range provides(ts.target, true) {
			estimated[s] = true
		}
	}
	var out []Problem
	for _, s := range AllSignals() {
		consumers := c.mu.declared[s]
		if len(consumers) == 0 || exact[s] {
			continue
		}
		p := Problem{Signal: s, Consumers: slices.Clone(consumers), Reason: missingReason(s)}
		if estimated[s] {
			p.Estimated = true
			p.Reason = "no gateway target: estimated from the prefill engines' used + evictable KV, " +
				"an underestimate once their caches evict live sessions' prefixes"
		}
		out = append(out, p)
	}
	return out
}

// provides lists what a target of its role and dialect can feed, exactly or as an estimate.
func provides(t Target, estimates bool) []Signal {
	if estimates {
		if t.Role.prefillSide() && t.Dialect != DialectVLLM {
			return []Signal{WorkingSet}
		}
		return nil
	}
	var out []Signal
	switch t.Role {
	case RoleGateway:
		return []Signal{WorkingSet, LiveSessions, SessionsInCall, QueuedSessions, ArrivalRate, CompletionRate, Budget, Reserved}
	case RoleDecode:
		out = append(out, DecodeFree, DecodeReserved, DecodeCapacity)
	}
	if t.Role.prefillSide() {
		out = append(out, HitRate, PromptTokenRate, CacheCapacity)
	}
	if t.Role.decodeSide() {
		out = append(out, CallRate, TTFTp50, TTFTp99)
	}
	return append(out, EngineQueue, KVUsageMax)
}

func missingReason(s Signal) string {
	switch s {
	case WorkingSet:
		return "no gateway target, and no SGLang prefill or unified target to estimate it from"
	case LiveSessions, SessionsInCall, QueuedSessions, ArrivalRate, CompletionRate, Budget, Reserved:
		return "no gateway target"
	case HitRate, PromptTokenRate, CacheCapacity:
		return "no prefill or unified target"
	case CallRate, TTFTp50, TTFTp99:
		return "no decode or unified target"
	case DecodeFree, DecodeReserved, DecodeCapacity:
		return "no decode target"
	}
	return "no engine target"
}

// Snapshot returns every known signal as of Options.Now.
func (c *Collector) Snapshot() Snapshot { return c.SnapshotAt(c.opts.Now()) }

// SnapshotAt returns every known signal as of now (for virtual-time callers): OK when its
// oldest input is at most StaleAfter intervals old, Stale when older, Missing when never
// computed.
func (c *Collector) SnapshotAt(now time.Time) Snapshot {
	all := AllSignals()
	snap := Snapshot{At: now, Signals: make(map[Signal]Value, len(all)), Window: c.opts.Window}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.mu.cacheRestart.After(now) {
		snap.CacheRestart = c.mu.cacheRestart
	}
	for _, sig := range all {
		v, ok := c.mu.values[sig]
		switch {
		case !ok:
			v = Value{State: Missing}
		case now.Sub(v.At) > c.staleAfter:
			v.State = Stale
		default:
			v.State = OK
		}
		snap.Signals[sig] = v
	}
	for _, name := range c.mu.order {
		ts := c.mu.targets[name]
		switch ts.target.Role {
		case RoleDecode:
			snap.Decode = append(snap.Decode, ts.decodeInstance(now, c.staleAfter, c.mu.affinity))
		case RolePrefill:
			snap.Prefill = append(snap.Prefill, ts.prefillInstance(now, c.staleAfter))
		}
	}
	return snap
}

// Targets returns the current targets (configured, from the file, and first seen by Ingest),
// sorted by name.
func (c *Collector) Targets() []Target {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Target, 0, len(c.mu.order))
	for _, name := range c.mu.order {
		out = append(out, c.mu.targets[name].target)
	}
	return out
}

// Ingest feeds one target's metric families, read at now, through the same derivation a scrape
// uses. A target not configured is added (it must be valid, URL optional); one whose name is
// configured with another role or dialect is an error. Readings must come in time order per
// target. The families are not modified or kept.
func (c *Collector) Ingest(now time.Time, t Target, fams map[string]*dto.MetricFamily) error {
	return c.ingest(now, t, fams, countSamples(fams), DialectAuto, true)
}

// IngestGathered is Ingest for the output of a prometheus.Gatherer, such as the simulator's
// per-instance registries.
func (c *Collector) IngestGathered(now time.Time, t Target, fams []*dto.MetricFamily) error {
	m := make(map[string]*dto.MetricFamily, len(fams))
	for _, mf := range fams {
		if _, dup := m[mf.GetName()]; !dup {
			m[mf.GetName()] = mf
		}
	}
	return c.Ingest(now, t, m)
}

// IngestText is Ingest for a body in the text exposition format, parsed as a scrape's body is
// (families the collector does not read are skipped before parsing).
func (c *Collector) IngestText(now time.Time, t Target, r io.Reader) error {
	raw, kept := getBuffer(), getBuffer()
	defer putBuffer(raw)
	defer putBuffer(kept)
	if _, err := raw.ReadFrom(r); err != nil {
		return fmt.Errorf("ingest %s: read: %w", t.Name, err)
	}
	fams, info, err := parseScrape(raw.Bytes(), kept)
	if err != nil {
		c.countError(t.Name, reasonParse)
		return fmt.Errorf("ingest %s: parse: %w", t.Name, err)
	}
	return c.ingest(now, t, fams, info.samples, info.dialect(), true)
}

// parseScrape filters a body down to the families the collector reads and parses those.
func parseScrape(body []byte, kept *bytes.Buffer) (map[string]*dto.MetricFamily, scanInfo, error) {
	info := filterText(kept, body)
	fams, err := parseBytes(kept.Bytes())
	return fams, info, err
}

// errGone is returned for a scrape whose target was removed or redefined meanwhile.
var errGone = errors.New("target removed while being scraped")

// ingest reduces families to a reading and records it. hint is the dialect a text scan found
// (auto when unknown). register adds unknown targets (Ingest); a scrape's target must still be
// in the list with the same definition.
func (c *Collector) ingest(now time.Time, t Target, fams map[string]*dto.MetricFamily, samples int,
	hint Dialect, register bool) error {
	t = t.withDefaults()
	if err := t.validate(false); err != nil {
		return fmt.Errorf("ingest %s: %w", t.Name, err)
	}
	d := t.Dialect
	if d == DialectAuto {
		d = hint
	}
	if d == DialectAuto {
		d = detectFamilies(fams)
	}
	if d == DialectAuto {
		c.countError(t.Name, reasonDialect)
		return fmt.Errorf("ingest %s: cannot tell the dialect: no (or mixed) sglang:, vllm: and basin_gateway_ metrics", t.Name)
	}
	if !d.fits(t.Role) {
		c.countError(t.Name, reasonDialect)
		return fmt.Errorf("ingest %s: a %s target exposes %s metrics", t.Name, t.Role, d)
	}
	r := extract(fams, d)
	r.at, r.samples = now, samples

	c.mu.Lock()
	defer c.mu.Unlock()
	ts := c.mu.targets[t.Name]
	// Ingest callers need not repeat a configured target's URL; a scrape's target must be the
	// one still configured.
	same := ts != nil && ts.target.Role == t.Role && ts.target.Dialect == t.Dialect &&
		(register || ts.target.URL == t.URL)
	switch {
	case ts != nil && !same && register:
		return fmt.Errorf("ingest %s: target is known as role %s, dialect %s; got role %s, dialect %s",
			t.Name, ts.target.Role, ts.target.Dialect, t.Role, t.Dialect)
	case !same && !register:
		return errGone
	case ts == nil:
		c.mu.pushed[t.Name] = t
		c.setTargetsLocked()
		ts = c.mu.targets[t.Name]
	}
	if ts.last != nil && now.Before(ts.last.at) {
		c.countError(t.Name, reasonOutOfOrder)
		return fmt.Errorf("ingest %s: reading at %v is older than the last one at %v", t.Name,
			now.Format(time.RFC3339Nano), ts.last.at.Format(time.RFC3339Nano))
	}
	c.recordLocked(ts, &r)
	c.recomputeLocked()
	return nil
}

// Forget drops a target first seen by Ingest, its state and its series: the caller knows it is
// gone (the simulator's harness, when a simulated instance is removed), where a target that only
// stops answering keeps its last reading and turns the signals it feeds stale, so that a dead
// engine never silently leaves the sums. Configured and file targets are not the caller's to
// drop; it reports whether the target was dropped.
func (c *Collector) Forget(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.mu.pushed[name]; !ok {
		return false
	}
	delete(c.mu.pushed, name)
	c.setTargetsLocked()
	return true
}

// recordLocked stores a reading and advances the target's windows.
func (c *Collector) recordLocked(ts *targetState, r *reading) {
	w := c.opts.Window
	name := ts.target.Name
	counter := func(win *counterWindow, in counterPair, out *windowRate) { c.advanceLocked(name, win, in, out, r.at) }
	c.recordHitsLocked(ts, r)
	counter(&ts.callWin, r.calls, &ts.calls)
	counter(&ts.arrWin, r.arrivals, &ts.arrivals)
	counter(&ts.complWin, r.completions, &ts.completions)
	if r.ttftSrc != "" {
		if ts.ttftWin.add(r.at, r.ttft, w) {
			c.log.Info("histogram window restarted (engine restart or bucket change)", "target", name, "metric", r.ttftSrc)
		}
		ts.ttftDelta, ts.ttftOK = ts.ttftWin.delta()
	} else {
		ts.ttftWin.clear()
		ts.ttftDelta, ts.ttftOK = hist{}, false
	}
	dialectChanged := ts.last == nil || ts.last.dialect != r.dialect
	ts.last = r
	if ts.failing {
		ts.failing = false
		c.log.Info("scrape recovered", "target", name)
	}
	if dialectChanged {
		c.updateTargetGaugeLocked()
	}
	c.metrics.scrapeSamples.WithLabelValues(name).Set(float64(r.samples))
	c.metrics.lastSuccess.WithLabelValues(name).Set(float64(r.at.UnixNano()) / 1e9)
	if r.duplicates > 0 {
		c.metrics.duplicates.WithLabelValues(name).Add(float64(r.duplicates))
		c.log.Debug("duplicate series ignored", "target", name, "count", r.duplicates)
	}
}

// advanceLocked adds a counter group's reading to its window and sets out to the window's rate.
func (c *Collector) advanceLocked(name string, win *counterWindow, in counterPair, out *windowRate, at time.Time) {
	if !in.ok {
		win.clear()
		*out = windowRate{}
		return
	}
	before := len(win.samples)
	restarted, incomplete := win.add(at, in.source, in.series, in.v, c.opts.Window)
	if incomplete {
		*out = windowRate{} // no rate from a scrape that lost a series: the signal holds, then goes stale
		return
	}
	if restarted && before > 0 {
		c.log.Info("counter window restarted (engine restart or metric change)", "target", name, "metric", in.source)
	}
	out.r, out.ok = win.rate()
}

// hitFamily is one prompt-token counter family's window on a target.
type hitFamily struct {
	source string
	win    counterWindow
	rate   windowRate
}

// recordHitsLocked advances the window of every prompt-token counter family the reading has and
// chooses the one the signals read (r.hit, ts.hit): the most preferred that advances over its
// window. Families of the same meaning can disagree — SGLang registers
// prefill_effective_tokens_total in builds that never increment it, while realtime_tokens_total
// grows — and reading the flat one would show a busy engine as a quiet one (a prompt-token rate
// of 0, no hit rate). When the preferred family is flat while another advances, that is logged
// once, when it starts, and shown by basin_counter_family_flat while it lasts.
func (c *Collector) recordHitsLocked(ts *targetState, r *reading) {
	name := ts.target.Name
	fams := make([]*hitFamily, 0, len(r.hits))
	for _, in := range r.hits {
		var f *hitFamily
		for _, old := range ts.hitFams {
			if old.source == in.source {
				f = old
			}
		}
		if f == nil {
			f = &hitFamily{source: in.source}
		}
		if n := len(f.win.samples); n > 0 && in.series >= f.win.series {
			// Counters that go back on the same series are a restarted engine, whose cache starts
			// empty (a lost series restarts the window too, but is no flush).
			if last := f.win.samples[n-1].v; in.v[0] < last[0] || in.v[1] < last[1] {
				c.mu.cacheRestart = r.at
			}
		}
		c.advanceLocked(name, &f.win, in, &f.rate, r.at)
		fams = append(fams, f)
	}
	ts.hitFams = fams
	r.hit, ts.hit = counterPair{}, windowRate{}
	if len(fams) == 0 {
		c.setFlatLocked(ts, "", "")
		return
	}
	use := 0
	for i, f := range fams {
		if f.rate.ok && f.rate.r[1] > 0 {
			use = i
			break
		}
	}
	r.hit, ts.hit = r.hits[use], fams[use].rate
	if pref := fams[0]; use > 0 && pref.rate.ok && pref.rate.r[1] == 0 {
		c.setFlatLocked(ts, pref.source, fams[use].source)
		// The flat family's window keeps only its last reading: should it start to advance, its
		// rate covers that time alone, not a window of standing still.
		n := len(pref.win.samples)
		pref.win.samples = pref.win.samples[:copy(pref.win.samples, pref.win.samples[n-1:])]
		pref.rate = windowRate{}
	} else {
		c.setFlatLocked(ts, "", "")
	}
}

// setFlatLocked records which preferred prompt-token family stands still while another
// advances (none when flat is empty), logging the change.
func (c *Collector) setFlatLocked(ts *targetState, flat, used string) {
	if ts.hitFlat == flat && ts.hitUsed == used {
		return
	}
	name := ts.target.Name
	if ts.hitFlat != "" {
		c.metrics.familyFlat.DeleteLabelValues(name, ts.hitFlat, ts.hitUsed)
	}
	switch {
	case flat != "":
		c.metrics.familyFlat.WithLabelValues(name, flat, used).Set(1)
		c.log.Warn("prompt-token counters disagree: the preferred family stands still over the window while another advances; "+
			"reading the one that advances", "target", name, "flat", flat, "used", used, "window", c.opts.Window)
	case ts.hitFlat != "":
		c.log.Info("prompt-token counters agree again", "target", name, "family", ts.hitFlat)
	}
	ts.hitFlat, ts.hitUsed = flat, used
}

func (c *Collector) countError(target, reason string) {
	c.metrics.scrapeErrors.WithLabelValues(target, reason).Inc()
}

// setTargetsLocked rebuilds the target set from the static, file and pushed lists: removed
// targets lose their state and series, redefined ones start afresh.
func (c *Collector) setTargetsLocked() {
	want := map[string]Target{}
	for _, t := range slices.Concat(c.mu.static, c.mu.file) {
		want[t.Name] = t
	}
	for name, t := range c.mu.pushed {
		if _, taken := want[name]; taken {
			delete(c.mu.pushed, name)
			continue
		}
		want[name] = t
	}
	var added, removed []string
	for name, ts := range c.mu.targets {
		if t, ok := want[name]; !ok || t != ts.target {
			delete(c.mu.targets, name)
			c.metrics.forget(name)
			removed = append(removed, name)
		}
	}
	for name, t := range want {
		if _, ok := c.mu.targets[name]; !ok {
			c.mu.targets[name] = &targetState{target: t}
			added = append(added, name)
		}
	}
	c.mu.order = c.mu.order[:0]
	for name := range c.mu.targets {
		c.mu.order = append(c.mu.order, name)
	}
	slices.Sort(c.mu.order)
	c.updateTargetGaugeLocked()
	if len(removed) > 0 {
		c.recomputeLocked()
	}
	if len(added)+len(removed) > 0 {
		slices.Sort(added)
		slices.Sort(removed)
		c.log.Info("targets changed", "added", added, "removed", removed, "targets", len(c.mu.order))
	}
}

// updateTargetGaugeLocked sets basin_targets from the current targets.
func (c *Collector) updateTargetGaugeLocked() {
	counts := map[[2]string]int{}
	for _, ts := range c.mu.targets {
		d := ts.target.Dialect
		if ts.last != nil {
			d = ts.last.dialect
		}
		counts[[2]string{string(ts.target.Role), string(d)}]++
	}
	c.metrics.targets.Reset()
	for k, n := range counts {
		c.metrics.targets.WithLabelValues(k[0], k[1]).Set(float64(n))
	}
}

var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func getBuffer() *bytes.Buffer { return buffers.Get().(*bytes.Buffer) }

// putBuffer returns a buffer to the pool unless it grew very large (an oversized scrape).
func putBuffer(b *bytes.Buffer) {
	if b.Cap() > 4<<20 {
		return
	}
	b.Reset()
	buffers.Put(b)
}

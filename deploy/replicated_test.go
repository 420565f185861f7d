package deploy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/daemon"
	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/internal/store"
	"github.com/basin-dev/basin/remediate/alerts"
)

// testPodIP stands for status.podIP when a test renders a pod's configuration.
const testPodIP = "10.244.3.17"

// parseDaemonConfig runs a daemon configuration through daemon.ParseConfig, which reads and checks
// its store block too, and returns it with that block.
func parseDaemonConfig(t *testing.T, data string) (*daemon.Config, store.Config) {
	t.Helper()
	cfg, err := daemon.ParseConfig([]byte(data))
	require.NoError(t, err)
	return cfg, cfg.Store
}

// TestDaemonParserKnowsStore: the replicated daemon's manifest, through the daemon's own parser,
// has a store (its block is not dropped or left for another check).
func TestDaemonParserKnowsStore(t *testing.T) {
	m := loadManifests(t, replicated)
	d, c := basinContainer(t, m, "basin-daemon")
	_, data := configFile(t, m, d, c)
	cfg, err := daemon.ParseConfig([]byte(data))
	require.NoError(t, err)
	assert.True(t, cfg.Store.Enabled())
}

// renderConfig runs the init container that writes file onto the emptyDir volume volName, in a
// temporary directory standing for its mounts and with status.podIP = podIP, and returns what it
// wrote. The script is the manifest's own, run by the local sh: only the mount paths change.
func renderConfig(t *testing.T, m manifests, d workload, volName, file string, mnt volumeMount, podIP string) string {
	t.Helper()
	pod := &d.template.Spec
	var init *container
	for i, c := range pod.InitContainers {
		if slices.ContainsFunc(c.VolumeMounts, func(vm volumeMount) bool { return vm.Name == volName && !vm.ReadOnly }) {
			init = &pod.InitContainers[i]
		}
	}
	require.NotNil(t, init, "%s: %s is on emptyDir %q, which no init container writes", d.name, file, volName)
	argv := append(slices.Clone(init.Command), init.Args...)
	require.Len(t, argv, 3, "%s: want sh -c SCRIPT, got %q", init.Name, argv)
	require.Equal(t, []string{"sh", "-c"}, argv[:2], "%s", init.Name)
	script := argv[2]
	dir := t.TempDir()
	for _, vm := range init.VolumeMounts {
		local := filepath.Join(dir, vm.Name)
		require.NoError(t, os.MkdirAll(local, 0o755))
		i := slices.IndexFunc(pod.Volumes, func(v volume) bool { return v.Name == vm.Name })
		require.True(t, i >= 0, "%s: volumeMount %q has no volume", init.Name, vm.Name)
		if v := pod.Volumes[i]; v.ConfigMap != nil {
			cm, ok := m.configMaps[v.ConfigMap.Name]
			require.True(t, ok, "ConfigMap %q", v.ConfigMap.Name)
			require.Empty(t, v.ConfigMap.Items, "items: not handled here")
			for k, data := range cm.Data {
				require.NoError(t, os.WriteFile(filepath.Join(local, k), []byte(data), 0o644))
			}
		}
		script = strings.ReplaceAll(script, strings.TrimSuffix(vm.MountPath, "/")+"/", local+"/")
	}
	env := []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range init.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			env = append(env, e.Name+"="+podIP)
		default:
			t.Fatalf("%s: env %s: only values and status.podIP are simulated", init.Name, e.Name)
		}
	}
	sh, err := exec.LookPath("sh")
	require.NoError(t, err, "rendering the configuration needs sh and sed")
	cmd := exec.Command(sh, "-c", script)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s's script:\n%s", init.Name, out)
	rel := strings.TrimPrefix(file, strings.TrimSuffix(mnt.MountPath, "/")+"/")
	data, err := os.ReadFile(filepath.Join(dir, volName, rel))
	require.NoError(t, err, "%s did not write %s", init.Name, file)
	return string(data)
}

// TestReplicatedGatewayConfig: the gateway's configuration reaches the pod with this pod's
// advertise_url (the init container puts the pod's IP in), and its replica_id is the pod's name
// (the host name, the default). Unrendered, the gateway refuses it rather than advertise a
// placeholder.
func TestReplicatedGatewayConfig(t *testing.T) {
	m := loadManifests(t, replicated)
	d, c := basinContainer(t, m, "basin-gateway")
	pod := &d.template.Spec
	adminPort, ok := c.port("admin")
	require.True(t, ok)
	i := slices.Index(c.Args, "--config")
	require.True(t, i >= 0 && i+1 < len(c.Args))
	file := c.Args[i+1]
	mnt, v := mountOf(pod, c, file)
	require.NotNil(t, v)
	require.NotNil(t, v.EmptyDir, "the rendered configuration is on the pod's own emptyDir")
	for _, tc := range []struct{ podIP, want string }{
		{"10.244.3.17", "http://10.244.3.17:" + strconv.Itoa(adminPort)},
		{"fd00:10:244::3", "http://[fd00:10:244::3]:" + strconv.Itoa(adminPort)},
	} {
		t.Run(tc.podIP, func(t *testing.T) {
			cfg, err := gateway.ParseConfig([]byte(renderConfig(t, m, d, v.Name, file, mnt, tc.podIP)))
			require.NoError(t, err)
			assert.Equal(t, tc.want, cfg.Replication.AdvertiseURL, "advertise_url: this pod's admin listener")
		})
	}

	// replica_id is left to its default, the host name: Kubernetes sets it to the pod's name
	// unless the pod spec names a host.
	tmpl := renderConfig(t, m, d, v.Name, file, mnt, testPodIP)
	var raw map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(tmpl), &raw))
	rep, _ := raw["replication"].(map[string]any)
	require.NotNil(t, rep, "replication:")
	assert.NotContains(t, rep, "replica_id", "replica_id: leave it to default to the pod name")
	assert.Empty(t, pod.Hostname, "hostname: the pod name must stay the host name")
	assert.Empty(t, pod.Subdomain)
	cfg, err := gateway.ParseConfig([]byte(tmpl))
	require.NoError(t, err)
	host, err := os.Hostname()
	require.NoError(t, err)
	assert.Equal(t, host, cfg.Replication.ReplicaID)

	// The template as it is in the ConfigMap fails, naming advertise_url.
	for _, vol := range pod.Volumes {
		if vol.ConfigMap == nil || vol.ConfigMap.Name != "basin-gateway-config" {
			continue
		}
		_, err := gateway.ParseConfig([]byte(m.configMaps[vol.ConfigMap.Name].Data["gateway.yaml"]))
		require.Error(t, err, "the unrendered template must not start a gateway")
		assert.Contains(t, err.Error(), "advertise_url")
	}
}

// intOrString reads a PodDisruptionBudget's or a rolling update's int-or-percent field as an int.
func intOrString(t *testing.T, field string, v any) int {
	t.Helper()
	n, ok := v.(int)
	require.True(t, ok, "%s: want a number of pods, got %v", field, v)
	return n
}

// budgetFor returns the PodDisruptionBudget selecting a workload's pods (exactly one).
func budgetFor(t *testing.T, m manifests, tmpl *podTemplate) *podDisruptionBudget {
	t.Helper()
	var out []*podDisruptionBudget
	for _, b := range m.budgets {
		if selects(b.Spec.Selector.MatchLabels, tmpl.Metadata.Labels) {
			out = append(out, b)
		}
	}
	require.Len(t, out, 1, "one PodDisruptionBudget selects the pods")
	return out[0]
}

// requireSpreadOverNodes checks the preferred anti-affinity that puts replicas on different nodes.
func requireSpreadOverNodes(t *testing.T, tmpl *podTemplate) {
	t.Helper()
	aff := tmpl.Spec.Affinity
	require.True(t, aff != nil && aff.PodAntiAffinity != nil, "podAntiAffinity")
	pa := aff.PodAntiAffinity.Preferred
	require.NotEmpty(t, pa, "preferredDuringSchedulingIgnoredDuringExecution: preferred, so a one-node cluster still runs them")
	assert.True(t, slices.ContainsFunc(pa, func(p struct {
		Weight          int `yaml:"weight"`
		PodAffinityTerm struct {
			TopologyKey   string        `yaml:"topologyKey"`
			LabelSelector labelSelector `yaml:"labelSelector"`
		} `yaml:"podAffinityTerm"`
	}) bool {
		return p.PodAffinityTerm.TopologyKey == "kubernetes.io/hostname" && p.Weight > 0 &&
			selects(p.PodAffinityTerm.LabelSelector.MatchLabels, tmpl.Metadata.Labels)
	}), "a term on kubernetes.io/hostname selecting the replicas themselves")
}

// TestReplicatedTopology: three gateways (a Deployment) and two daemons (a StatefulSet, for
// their per-pod names: requireDaemonPodNames), rolled one pod at a time, spread over nodes, with
// disruption budgets a drain can satisfy.
func TestReplicatedTopology(t *testing.T) {
	m := loadManifests(t, replicated)
	for _, tc := range []struct {
		name, kind                   string
		replicas                     int
		minAvailable, maxUnavailable int // 0: not set
	}{
		{"basin-gateway", "Deployment", 3, 2, 0},
		{"basin-daemon", "StatefulSet", 2, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, _ := basinContainer(t, m, tc.name)
			require.Equal(t, tc.kind, w.kind)
			require.NotNil(t, w.replicasField)
			assert.Equal(t, tc.replicas, *w.replicasField, "replicas")
			switch w.kind {
			case "Deployment":
				d := w.deployment
				assert.Equal(t, "RollingUpdate", d.Spec.Strategy.Type)
				require.NotNil(t, d.Spec.Strategy.RollingUpdate, "rollingUpdate")
				assert.Equal(t, 1, intOrString(t, "maxUnavailable", d.Spec.Strategy.RollingUpdate.MaxUnavailable))
			case "StatefulSet":
				s := w.statefulSet
				// OrderedReady would hold the second daemon until the first is Ready, and a
				// blind daemon is not.
				assert.Equal(t, "Parallel", s.Spec.PodManagementPolicy, "podManagementPolicy")
				assert.Contains(t, []string{"", "RollingUpdate"}, s.Spec.UpdateStrategy.Type, "updateStrategy: one pod at a time")
				if ru := s.Spec.UpdateStrategy.RollingUpdate; ru != nil {
					assert.Nil(t, ru.Partition, "a partition would leave pods on the old revision")
				}
				requireDaemonPodNames(t, m, w)
			}
			requireSpreadOverNodes(t, w.template)
			b := budgetFor(t, m, w.template)
			if tc.minAvailable > 0 {
				assert.Nil(t, b.Spec.MaxUnavailable)
				got := intOrString(t, "minAvailable", b.Spec.MinAvailable)
				assert.Equal(t, tc.minAvailable, got, "minAvailable")
				assert.Less(t, got, w.replicas, "minAvailable must leave a drain one pod to evict")
			} else {
				assert.Nil(t, b.Spec.MinAvailable)
				assert.Equal(t, tc.maxUnavailable, intOrString(t, "maxUnavailable", b.Spec.MaxUnavailable), "maxUnavailable")
			}
		})
	}
	for name, b := range m.budgets {
		n := 0
		for _, w := range m.workloads() {
			if selects(b.Spec.Selector.MatchLabels, w.template.Metadata.Labels) {
				n++
			}
		}
		assert.Equal(t, 1, n, "PodDisruptionBudget %s selects one workload", name)
	}
	// Any replica serves any session: no stickiness on the agents' Service.
	svc, ok := m.services["basin-gateway"]
	require.True(t, ok)
	assert.Empty(t, svc.Spec.SessionAffinity, "sessionAffinity: any replica serves any session")
}

// TestReplicatedStoreBlocks: the gateways and the daemons use the same store, with the same
// explicit prefix (their defaults differ), the Secret's password, and the store's Service.
func TestReplicatedStoreBlocks(t *testing.T) {
	m := loadManifests(t, replicated)
	gw := gatewayConfig(t, m)
	dm, ds := daemonConfig(t, m)
	require.True(t, gw.Store.Enabled())
	require.True(t, ds.Enabled())
	assert.Equal(t, gw.Store.URL, ds.URL, "store.url")
	assert.Equal(t, gw.Store.Prefix, ds.Prefix, "store.prefix")
	assert.Equal(t, "basin:"+dm.Deployment, gw.Store.Prefix, "store.prefix: the daemon's default for its deployment, set in both")
	for _, name := range []string{"basin-gateway", "basin-daemon"} {
		d, c := basinContainer(t, m, name)
		_, data := configFile(t, m, d, c)
		var raw struct {
			Store map[string]any `yaml:"store"`
		}
		require.NoError(t, yaml.Unmarshal([]byte(data), &raw))
		assert.Contains(t, raw.Store, "prefix", "%s: store.prefix set explicitly (the defaults differ)", name)
	}
	gd, gc := basinContainer(t, m, "basin-gateway")
	dd, dc := basinContainer(t, m, "basin-daemon")
	gkey := requireSecretFile(t, m, &gd.template.Spec, gc, "store.password_file", gw.Store.PasswordFile)
	dkey := requireSecretFile(t, m, &dd.template.Spec, dc, "store.password_file", ds.PasswordFile)
	assert.Equal(t, gkey, dkey, "the same password")

	// The URL is the store's Service, on its redis port, and the server's password is that key.
	st, ok := m.statefulSets["basin-store"]
	require.True(t, ok, "StatefulSet basin-store")
	requireServicePort(t, m, "store.url", gw.Store.URL, &st.Spec.Template, "redis")
	c := st.Spec.Template.Spec.Containers[0]
	i := slices.Index(c.Args, "--requirepass")
	require.True(t, i >= 0 && i+1 < len(c.Args), "the server's --requirepass")
	ref := strings.TrimSuffix(strings.TrimPrefix(c.Args[i+1], "$("), ")")
	require.NotEqual(t, ref, c.Args[i+1], "--requirepass $(VAR), from the Secret, not a literal")
	j := slices.IndexFunc(c.Env, func(e envVar) bool { return e.Name == ref })
	require.True(t, j >= 0, "env %s", ref)
	e := c.Env[j]
	require.True(t, e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil, "env %s from a Secret", ref)
	assert.Equal(t, gkey, e.ValueFrom.SecretKeyRef.Key, "the server's password is the clients' store.password_file")

	assert.Contains(t, []string{gateway.DegradedLocalSlice, gateway.DegradedRefuse}, gw.Replication.DegradedAdmission)
}

// redisConf reads redis.conf directives: the first word of each line, the rest as its words.
func redisConf(t *testing.T, text string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		k := strings.ToLower(f[0])
		require.NotContains(t, out, k, "%s given twice", k)
		out[k] = f[1:]
	}
	return out
}

// TestStoreIsDurable: the store keeps an append-only file, fsynced every second, on its
// PersistentVolumeClaim, and never evicts a key.
func TestStoreIsDurable(t *testing.T) {
	m := loadManifests(t, replicated)
	st, ok := m.statefulSets["basin-store"]
	require.True(t, ok)
	require.NotNil(t, st.Spec.Replicas)
	assert.Equal(t, 1, *st.Spec.Replicas, "one server: basin's store client speaks to one")
	_, ok = m.services[st.Spec.ServiceName]
	assert.True(t, ok, "serviceName %q is a Service", st.Spec.ServiceName)
	pod := &st.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	require.NotEmpty(t, c.Args)
	conf := c.Args[0]
	mnt, v := mountOf(pod, c, conf)
	require.NotNil(t, v)
	require.NotNil(t, v.ConfigMap, "%s from a ConfigMap", conf)
	dirs := redisConf(t, configMapFile(t, m, st.Metadata.Name, v, mnt, conf))
	for k, want := range map[string][]string{
		"appendonly":       {"yes"},
		"appendfsync":      {"everysec"},
		"maxmemory-policy": {"noeviction"},
	} {
		assert.Equal(t, want, dirs[k], "%s", k)
	}
	assert.NotContains(t, dirs, "requirepass", "the password comes from the Secret, not the ConfigMap")
	require.Len(t, dirs["dir"], 1, "dir")
	dataMnt, dataVol := mountOf(pod, c, dirs["dir"][0])
	require.Nil(t, dataVol, "dir %s: on the claim template, not a pod volume", dirs["dir"][0])
	require.NotEmpty(t, dataMnt.Name, "dir %s is on no mount", dirs["dir"][0])
	assert.True(t, slices.ContainsFunc(st.Spec.VolumeClaimTemplates, func(p persistentVolumeClaim) bool {
		return p.Metadata.Name == dataMnt.Name
	}), "dir %s: on a volumeClaimTemplate, so the append-only file outlives the pod", dirs["dir"][0])
	for _, p := range []*probe{c.ReadinessProbe, c.LivenessProbe} {
		require.NotNil(t, p, "probes")
	}
	assert.Nil(t, c.LivenessProbe.Exec, "liveness must not fail while the server loads its append-only file")
}

// TestGatewayProbesHitTheirHandlers asks a real gateway's admin handler the paths the probes
// name: liveness answers while the upstreams are down (restarting would not help), readiness
// does not (the Service should send callers elsewhere) and answers once one is up.
func TestGatewayProbesHitTheirHandlers(t *testing.T) {
	base := gatewayConfig(t, loadManifests(t, single))
	forEachMode(t, func(t *testing.T, m manifests) {
		_, c := basinContainer(t, m, "basin-gateway")
		for _, p := range []*probe{c.ReadinessProbe, c.LivenessProbe} {
			require.True(t, p != nil && p.HTTPGet != nil, "httpGet probes")
			assert.Equal(t, "admin", p.HTTPGet.Port, "probes on the admin listener")
		}
		for _, upHealthy := range []bool{false, true} {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if !upHealthy {
					w.WriteHeader(http.StatusServiceUnavailable)
				}
			}))
			cfg := *base
			cfg.Upstreams, cfg.AdminTokenFile, cfg.StateFile = []string{up.URL}, "", ""
			g, err := gateway.New(gateway.Options{Config: &cfg, Getenv: func(k string) string {
				if k == gateway.AdminTokenEnv {
					return "test-token"
				}
				return ""
			}})
			require.NoError(t, err)
			get := func(p string) int {
				rec := httptest.NewRecorder()
				g.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, p, nil))
				return rec.Code
			}
			assert.Equal(t, http.StatusOK, get(c.LivenessProbe.HTTPGet.Path), "liveness %s, upstream healthy %v", c.LivenessProbe.HTTPGet.Path, upHealthy)
			want := http.StatusServiceUnavailable
			if upHealthy {
				want = http.StatusOK
			}
			assert.Equal(t, want, get(c.ReadinessProbe.HTTPGet.Path), "readiness %s, upstream healthy %v", c.ReadinessProbe.HTTPGet.Path, upHealthy)
			up.Close()
		}
	})
}

// TestSystemdReplicated: the drop-ins that make the two units a store-backed pair on two hosts,
// with the example configurations they expect, and the store's settings for Debian's
// redis-server.
func TestSystemdReplicated(t *testing.T) {
	dir := filepath.Join(systemdDir, "replicated")
	read := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		return data
	}
	// credential maps a unit's /run/credentials path to the file LoadCredential names, or fails.
	credential := func(t *testing.T, unitName string, svc map[string][]string, base unit, field, file string) {
		t.Helper()
		prefix := "/run/credentials/" + unitName + "/"
		require.True(t, strings.HasPrefix(file, prefix), "%s %s: want a credential under %s", field, file, prefix)
		id := strings.TrimPrefix(file, prefix)
		creds := append(slices.Clone(base["Service"]["LoadCredential"]), svc["LoadCredential"]...)
		assert.True(t, slices.ContainsFunc(creds, func(c string) bool { return strings.HasPrefix(c, id+":") }),
			"%s %s: no LoadCredential=%s:… in the unit or its drop-in", field, file, id)
	}
	var stores []store.Config
	for _, sub := range []string{"gateway", "daemon"} {
		t.Run(sub, func(t *testing.T) {
			unitName := "basin-" + sub + ".service"
			d, err := parseUnit(read(unitName + ".d/10-store.conf"))
			require.NoError(t, err)
			baseData, err := os.ReadFile(filepath.Join(systemdDir, unitName))
			require.NoError(t, err)
			base, err := parseUnit(baseData)
			require.NoError(t, err)
			// After the local store at boot, but never stopped or failed with it.
			assert.Contains(t, d["Unit"]["Wants"], "redis-server.service")
			assert.Contains(t, d["Unit"]["After"], "redis-server.service")
			for _, k := range []string{"Requires", "BindsTo", "PartOf", "Requisite"} {
				assert.NotContains(t, d["Unit"], k, "[Unit] %s: a store restart must not stop %s", k, unitName)
			}
			assert.Equal(t, []string{"store-password:/etc/basin/credentials/store-password"}, d["Service"]["LoadCredential"])

			var sc store.Config
			switch sub {
			case "gateway":
				cfg, err := gateway.ParseConfig(read("gateway.yaml"))
				require.NoError(t, err)
				sc = cfg.Store
				assert.Empty(t, cfg.StateFile)
				credential(t, unitName, d["Service"], base, "admin_token_file", cfg.AdminTokenFile)
				_, adminPort, err := net.SplitHostPort(cfg.AdminListen)
				require.NoError(t, err)
				u, err := url.Parse(cfg.Replication.AdvertiseURL)
				require.NoError(t, err)
				assert.Equal(t, adminPort, u.Port(), "advertise_url: the admin listener's port")
				assert.NotContains(t, []string{"", "127.0.0.1", "localhost", "::1", "0.0.0.0"}, u.Hostname(),
					"advertise_url: an address the other host reaches")
			case "daemon":
				cfg, dsc := parseDaemonConfig(t, string(read("daemon.yaml")))
				sc = dsc
				credential(t, unitName, d["Service"], base, "token_file", cfg.TokenFile)
				credential(t, unitName, d["Service"], base, "gateway.token_file", cfg.Gateway.TokenFile)
				assert.Equal(t, "/var/lib/"+base["Service"]["StateDirectory"][0], cfg.DataDir, "data_dir: the unit's StateDirectory")
			}
			require.True(t, sc.Enabled(), "store.url")
			credential(t, unitName, d["Service"], base, "store.password_file", sc.PasswordFile)
			stores = append(stores, sc)
		})
	}
	require.Len(t, stores, 2)
	assert.Equal(t, stores[0].URL, stores[1].URL, "the same store")
	assert.Equal(t, stores[0].Prefix, stores[1].Prefix, "the same prefix")

	conf := redisConf(t, string(read("redis-basin.conf")))
	for k, want := range map[string][]string{
		"appendonly":       {"yes"},
		"appendfsync":      {"everysec"},
		"maxmemory-policy": {"noeviction"},
	} {
		assert.Equal(t, want, conf[k], "%s", k)
	}
	assert.NotContains(t, conf, "requirepass", "no password in the repository")
	u, err := url.Parse(stores[0].URL)
	require.NoError(t, err)
	assert.Contains(t, conf["bind"], u.Hostname(), "bind: the address store.url names")
	assert.Equal(t, []string{u.Port()}, conf["port"])
}

// TestStoreConfigsOnARealServer starts redis-server (the Debian package; Valkey reads the same
// files) on the Kubernetes store's valkey.conf and on the systemd host's redis-basin.conf, with
// only the address and directory changed, and checks that it accepts every line and runs with an
// append-only file, fsync every second and no eviction, and that a client configured like the
// gateway (store.password_file) gets in with the password given on the command line. Skipped
// without redis-server, except under CI.
func TestStoreConfigsOnARealServer(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server not on PATH under CI: .ci/run must install the Debian package redis-server")
		}
		t.Skip("redis-server not on PATH: install the Debian package redis-server to check the store's configuration")
	}
	m := loadManifests(t, replicated)
	st := m.statefulSets["basin-store"]
	require.NotNil(t, st)
	c := st.Spec.Template.Spec.Containers[0]
	mnt, v := mountOf(&st.Spec.Template.Spec, c, c.Args[0])
	require.NotNil(t, v)
	systemdConf, err := os.ReadFile(filepath.Join(systemdDir, "replicated", "redis-basin.conf"))
	require.NoError(t, err)
	for name, conf := range map[string]string{
		"kubernetes": configMapFile(t, m, st.Metadata.Name, v, mnt, c.Args[0]),
		"systemd":    string(systemdConf),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			// dir is applied as the file is read (a chdir), so it is rewritten, not overridden.
			var lines []string
			for _, l := range strings.Split(conf, "\n") {
				if f := strings.Fields(l); len(f) > 0 && f[0] == "dir" {
					l = "dir " + dir
				}
				lines = append(lines, l)
			}
			file := filepath.Join(dir, "redis.conf")
			require.NoError(t, os.WriteFile(file, []byte(strings.Join(lines, "\n")), 0o600))
			l, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			addr := l.Addr().String()
			require.NoError(t, l.Close())
			_, port, _ := net.SplitHostPort(addr)
			const password = "0123456789abcdef0123456789abcdef"
			cmd := exec.Command(bin, file, "--port", port, "--bind", "127.0.0.1", "--requirepass", password, "--daemonize", "no")
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

			pwFile := filepath.Join(dir, "store-password")
			require.NoError(t, os.WriteFile(pwFile, []byte(password+"\n"), 0o600))
			sc := store.Config{URL: "redis://" + addr + "/0", PasswordFile: pwFile}.WithDefaults("agents-prod", 5*time.Second)
			require.Empty(t, sc.Check())
			var client *redis.Client
			deadline := time.Now().Add(5 * time.Second)
			for {
				client, err = store.Open(context.Background(), sc, func(string) string { return "" })
				if err == nil {
					break
				}
				require.True(t, time.Now().Before(deadline), "redis-server did not come up with %s: %v\n%s", name, err, out.String())
				time.Sleep(20 * time.Millisecond)
			}
			defer func() { _ = client.Close() }()
			for k, want := range map[string]string{
				"appendonly":       "yes",
				"appendfsync":      "everysec",
				"maxmemory-policy": "noeviction",
			} {
				got, err := client.ConfigGet(context.Background(), k).Result()
				require.NoError(t, err)
				assert.Equal(t, want, got[k], "%s", k)
			}
		})
	}
}

// gatewayTargets are the collector's targets with role gateway.
func gatewayTargets(cfg *daemon.Config) []collector.Target {
	var out []collector.Target
	for _, tg := range cfg.Collector.Targets {
		if tg.Role == collector.RoleGateway {
			out = append(out, tg)
		}
	}
	return out
}

// TestReplicatedDaemonReadsAdmissionMetrics: a replicated gateway's own /metrics carries the
// admission series only on the leader, so a daemon reading one address (a Service, or one host)
// would see them on some scrapes only, and one target per replica would be added up by the
// collector. The replicated daemons read one target, AdmissionMetricsPath, which any replica
// answers with the leader's: on Kubernetes through the gateways' admin Service, on the systemd
// pair from the local replica.
func TestReplicatedDaemonReadsAdmissionMetrics(t *testing.T) {
	t.Run("kubernetes", func(t *testing.T) {
		m := loadManifests(t, replicated)
		cfg, _ := daemonConfig(t, m)
		tgs := gatewayTargets(cfg)
		require.Len(t, tgs, 1, "one gateway target: the collector sums gateway targets")
		u, err := url.Parse(tgs[0].URL)
		require.NoError(t, err)
		assert.Equal(t, gateway.AdmissionMetricsPath, u.Path, "the gateway target's path")
		assert.Equal(t, collector.DialectGateway, tgs[0].Dialect)
		gw, _ := basinContainer(t, m, "basin-gateway")
		requireServicePort(t, m, "collector.targets "+tgs[0].Name, tgs[0].URL, gw.template, "admin")
	})
	t.Run("systemd", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(systemdDir, "replicated", "daemon.yaml"))
		require.NoError(t, err)
		cfg, _ := parseDaemonConfig(t, string(data))
		gcfg, err := gateway.ParseConfig(mustRead(t, filepath.Join(systemdDir, "replicated", "gateway.yaml")))
		require.NoError(t, err)
		tgs := gatewayTargets(cfg)
		require.Len(t, tgs, 1, "one gateway target: the collector sums gateway targets")
		u, err := url.Parse(tgs[0].URL)
		require.NoError(t, err)
		assert.Equal(t, gateway.AdmissionMetricsPath, u.Path, "the gateway target's path")
		_, adminPort, err := net.SplitHostPort(gcfg.AdminListen)
		require.NoError(t, err)
		assert.Equal(t, adminPort, u.Port(), "the gateway's admin listener")
	})
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(name)
	require.NoError(t, err)
	return data
}

// requireDaemonPodNames checks the daemons' StatefulSet's governing Service: headless, so that
// each pod has its DNS name (<pod>.<service>), selecting the daemons, with the webhook's port,
// and publishing a blind (unready) daemon's name too. It returns the Service.
func requireDaemonPodNames(t *testing.T, m manifests, w workload) *service {
	t.Helper()
	require.NotNil(t, w.statefulSet, "%s: a StatefulSet, for per-pod DNS names", w.name)
	name := w.statefulSet.Spec.ServiceName
	svc, ok := m.services[name]
	require.True(t, ok, "serviceName %q is a Service", name)
	assert.Equal(t, "None", svc.Spec.ClusterIP, "Service %s: headless (clusterIP: None), so each pod has its name", name)
	assert.True(t, selects(svc.Spec.Selector, w.template.Metadata.Labels), "Service %s selects the daemons", name)
	assert.True(t, svc.Spec.PublishNotReadyAddresses, "Service %s: publishNotReadyAddresses, so a blind daemon's name resolves", name)
	c := w.template.Spec.Containers[0]
	assert.True(t, slices.ContainsFunc(svc.Spec.Ports, func(p servicePort) bool { return p.TargetPort == "http" }),
		"Service %s: the daemon's http port", name)
	_, ok = c.port("http")
	assert.True(t, ok)
	// The status page and the API stay behind a normal Service, which the ServiceMonitor scrapes;
	// the headless one must not be selected too (every pod would be scraped twice).
	normal, ok := m.services[w.name]
	require.True(t, ok, "the daemons' Service %s", w.name)
	assert.NotEqual(t, "None", normal.Spec.ClusterIP, "Service %s: a normal Service for the status page and the API", w.name)
	for smName, sm := range m.serviceMonitors {
		assert.False(t, selects(sm.Spec.Selector.MatchLabels, svc.Metadata.Labels), "ServiceMonitor %s selects the headless Service %s", smName, name)
	}
	return svc
}

// alertmanagerFile is the example Alertmanager configuration for replicated mode.
const alertmanagerFile = "alertmanager/replicated.yml"

// amConfig is the part of an Alertmanager configuration the test reads.
type amConfig struct {
	Receivers []amReceiver `yaml:"receivers"`
}

type amReceiver struct {
	Name           string `yaml:"name"`
	WebhookConfigs []struct {
		URL          string `yaml:"url"`
		SendResolved bool   `yaml:"send_resolved"`
		HTTPConfig   struct {
			Authorization struct {
				CredentialsFile string `yaml:"credentials_file"`
			} `yaml:"authorization"`
		} `yaml:"http_config"`
	} `yaml:"webhook_configs"`
}

// TestAlertmanagerNotifiesEveryDaemon: only the acting daemon enters incident mode from an alert,
// and a notification through the daemons' Service reaches one of the two, possibly the standby.
// The example Alertmanager configuration's basin receiver has one webhook per daemon pod, by its
// stable name (<statefulset>-<ordinal>.<headless service>), on the webhook's path, with the
// daemon token, and routes each alert the daemon's alerts.matchers select to it (amtool).
func TestAlertmanagerNotifiesEveryDaemon(t *testing.T) {
	m := loadManifests(t, replicated)
	w, c := basinContainer(t, m, "basin-daemon")
	headless := requireDaemonPodNames(t, m, w)
	var port int
	for _, p := range headless.Spec.Ports {
		if p.TargetPort == "http" {
			port = p.Port
		}
	}
	var want []string
	for i := range w.replicas {
		want = append(want, fmt.Sprintf("http://%s-%d.%s.%s.svc.cluster.local:%d%s",
			w.name, i, headless.Metadata.Name, headless.Metadata.Namespace, port, alerts.Path))
	}
	require.Len(t, want, 2)

	data := mustRead(t, alertmanagerFile)
	var am amConfig
	require.NoError(t, yaml.Unmarshal(data, &am))
	i := slices.IndexFunc(am.Receivers, func(r amReceiver) bool { return r.Name == "basin" })
	require.True(t, i >= 0, "a receiver named basin")
	var got []string
	cfg, _ := daemonConfig(t, m)
	tokenKey := requireSecretFile(t, m, &w.template.Spec, c, "token_file", cfg.TokenFile)
	for _, wc := range am.Receivers[i].WebhookConfigs {
		got = append(got, wc.URL)
		assert.True(t, wc.SendResolved, "%s: send_resolved, or incident mode waits for the alert to expire", wc.URL)
		assert.Equal(t, tokenKey, path.Base(wc.HTTPConfig.Authorization.CredentialsFile),
			"%s: the daemon token (Secret key %s) as the bearer", wc.URL, tokenKey)
	}
	assert.ElementsMatch(t, want, got, "one webhook per daemon pod, by its name: not the Service, which reaches one of them")

	amtool, err := exec.LookPath("amtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("amtool not on PATH under CI: .ci/run must install the Debian package prometheus-alertmanager")
		}
		t.Skip("amtool not on PATH: install prometheus-alertmanager to check the routes")
	}
	out, err := exec.Command(amtool, "check-config", alertmanagerFile).CombinedOutput()
	require.NoError(t, err, "amtool check-config:\n%s", out)
	require.NotEmpty(t, cfg.Alerts.Matchers, "alerts.matchers: the alerts routed to basin")
	for _, mt := range cfg.Alerts.Matchers {
		args := []string{"config", "routes", "test", "--config.file=" + alertmanagerFile, "alertname=" + mt.AlertName, "deployment=" + cfg.Deployment}
		for k, v := range mt.Labels {
			args = append(args, k+"="+v)
		}
		out, err := exec.Command(amtool, args...).Output()
		require.NoError(t, err, "amtool %s", strings.Join(args, " "))
		assert.Contains(t, strings.Split(strings.TrimSpace(string(out)), ","), "basin", "alert %s is routed to %s", mt.AlertName, out)
	}
}

package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/basin-dev/basin/daemon"
	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/internal/store"
)

const (
	kubernetesDir = "kubernetes"
	systemdDir    = "systemd"
	rulesFile     = "../rules/basin.rules.yml"
)

// The environment variables the binaries read; any other name in a manifest is a typo.
var knownEnv = []string{gateway.AdminTokenEnv, daemon.TokenEnv, daemon.GatewayTokenEnv, daemon.SlackTokenEnv, daemon.SlackWebhookEnv,
	store.PasswordEnv}

// The job names rules/basin.rules.yml expects (its header).
const (
	daemonJob  = "basin-daemon"
	gatewayJob = "basin-gateway"
)

// --- The subset of the Kubernetes and Prometheus Operator schemas the manifests use. Decoded with
// unknown fields refused, so a misspelt field (replica:, mountpath:) fails instead of being
// silently dropped by the API server's defaults.

type objectMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type typeMeta struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
}

type namespace struct {
	typeMeta `yaml:",inline"`
}

type secret struct {
	typeMeta   `yaml:",inline"`
	Type       string            `yaml:"type"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
}

func (s secret) has(key string) bool {
	_, a := s.Data[key]
	_, b := s.StringData[key]
	return a || b
}

type configMap struct {
	typeMeta `yaml:",inline"`
	Data     map[string]string `yaml:"data"`
}

type resources struct {
	Requests map[string]any `yaml:"requests"`
	Limits   map[string]any `yaml:"limits"`
}

type persistentVolumeClaim struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		AccessModes      []string  `yaml:"accessModes"`
		StorageClassName *string   `yaml:"storageClassName"`
		Resources        resources `yaml:"resources"`
	} `yaml:"spec"`
}

type keyToPath struct {
	Key  string `yaml:"key"`
	Path string `yaml:"path"`
}

type volume struct {
	Name      string `yaml:"name"`
	ConfigMap *struct {
		Name  string      `yaml:"name"`
		Items []keyToPath `yaml:"items"`
	} `yaml:"configMap"`
	Secret *struct {
		SecretName  string      `yaml:"secretName"`
		DefaultMode *int        `yaml:"defaultMode"`
		Optional    *bool       `yaml:"optional"`
		Items       []keyToPath `yaml:"items"`
	} `yaml:"secret"`
	PersistentVolumeClaim *struct {
		ClaimName string `yaml:"claimName"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"persistentVolumeClaim"`
	EmptyDir *struct {
		Medium    string `yaml:"medium"`
		SizeLimit string `yaml:"sizeLimit"`
	} `yaml:"emptyDir"`
}

type volumeMount struct {
	Name      string `yaml:"name"`
	MountPath string `yaml:"mountPath"`
	SubPath   string `yaml:"subPath"`
	ReadOnly  bool   `yaml:"readOnly"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name     string `yaml:"name"`
			Key      string `yaml:"key"`
			Optional *bool  `yaml:"optional"`
		} `yaml:"secretKeyRef"`
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

type probe struct {
	HTTPGet *struct {
		Path   string `yaml:"path"`
		Port   string `yaml:"port"`
		Scheme string `yaml:"scheme"`
	} `yaml:"httpGet"`
	Exec *struct {
		Command []string `yaml:"command"`
	} `yaml:"exec"`
	TCPSocket *struct {
		Port string `yaml:"port"`
	} `yaml:"tcpSocket"`
	InitialDelaySeconds int `yaml:"initialDelaySeconds"`
	SuccessThreshold    int `yaml:"successThreshold"`
	PeriodSeconds       int `yaml:"periodSeconds"`
	TimeoutSeconds      int `yaml:"timeoutSeconds"`
	FailureThreshold    int `yaml:"failureThreshold"`
}

type containerPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
	Protocol      string `yaml:"protocol"`
}

type container struct {
	Name            string          `yaml:"name"`
	Image           string          `yaml:"image"`
	ImagePullPolicy string          `yaml:"imagePullPolicy"`
	Command         []string        `yaml:"command"`
	Args            []string        `yaml:"args"`
	Ports           []containerPort `yaml:"ports"`
	Env             []envVar        `yaml:"env"`
	ReadinessProbe  *probe          `yaml:"readinessProbe"`
	LivenessProbe   *probe          `yaml:"livenessProbe"`
	StartupProbe    *probe          `yaml:"startupProbe"`
	Resources       resources       `yaml:"resources"`
	SecurityContext *struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		Capabilities             *struct {
			Add  []string `yaml:"add"`
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []volumeMount `yaml:"volumeMounts"`
}

func (c container) port(name string) (int, bool) {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

// podSpec is a pod template's spec.
type podSpec struct {
	ServiceAccountName            string `yaml:"serviceAccountName"`
	AutomountServiceAccountToken  *bool  `yaml:"automountServiceAccountToken"`
	TerminationGracePeriodSeconds *int   `yaml:"terminationGracePeriodSeconds"`
	// Hostname and Subdomain are declared so that a test can see they are unset: the pod's host
	// name is then its name, the replicated gateway's default replica_id.
	Hostname        string `yaml:"hostname"`
	Subdomain       string `yaml:"subdomain"`
	SecurityContext *struct {
		RunAsNonRoot   *bool  `yaml:"runAsNonRoot"`
		RunAsUser      *int64 `yaml:"runAsUser"`
		RunAsGroup     *int64 `yaml:"runAsGroup"`
		FSGroup        *int64 `yaml:"fsGroup"`
		SeccompProfile *struct {
			Type string `yaml:"type"`
		} `yaml:"seccompProfile"`
	} `yaml:"securityContext"`
	Affinity *struct {
		PodAntiAffinity *struct {
			Preferred []struct {
				Weight          int `yaml:"weight"`
				PodAffinityTerm struct {
					TopologyKey   string        `yaml:"topologyKey"`
					LabelSelector labelSelector `yaml:"labelSelector"`
				} `yaml:"podAffinityTerm"`
			} `yaml:"preferredDuringSchedulingIgnoredDuringExecution"`
		} `yaml:"podAntiAffinity"`
	} `yaml:"affinity"`
	InitContainers []container `yaml:"initContainers"`
	Containers     []container `yaml:"containers"`
	Volumes        []volume    `yaml:"volumes"`
}

type podTemplate struct {
	Metadata objectMeta `yaml:"metadata"`
	Spec     podSpec    `yaml:"spec"`
}

type deployment struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		Replicas *int `yaml:"replicas"`
		Strategy struct {
			Type          string `yaml:"type"`
			RollingUpdate *struct {
				MaxUnavailable any `yaml:"maxUnavailable"`
				MaxSurge       any `yaml:"maxSurge"`
			} `yaml:"rollingUpdate"`
		} `yaml:"strategy"`
		Selector labelSelector `yaml:"selector"`
		Template podTemplate   `yaml:"template"`
	} `yaml:"spec"`
}

type statefulSet struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		ServiceName         string `yaml:"serviceName"`
		Replicas            *int   `yaml:"replicas"`
		PodManagementPolicy string `yaml:"podManagementPolicy"`
		UpdateStrategy      struct {
			Type          string `yaml:"type"`
			RollingUpdate *struct {
				Partition      *int `yaml:"partition"`
				MaxUnavailable any  `yaml:"maxUnavailable"`
			} `yaml:"rollingUpdate"`
		} `yaml:"updateStrategy"`
		Selector             labelSelector           `yaml:"selector"`
		Template             podTemplate             `yaml:"template"`
		VolumeClaimTemplates []persistentVolumeClaim `yaml:"volumeClaimTemplates"`
	} `yaml:"spec"`
}

type podDisruptionBudget struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		MinAvailable   any           `yaml:"minAvailable"`
		MaxUnavailable any           `yaml:"maxUnavailable"`
		Selector       labelSelector `yaml:"selector"`
	} `yaml:"spec"`
}

// workload is a Deployment or a StatefulSet: what Services, ServiceMonitors and budgets select,
// and what runs a basin binary in either mode.
type workload struct {
	kind, name string
	replicas   int
	// replicasField is spec.replicas as written (nil: left to the API server's default, 1).
	replicasField *int
	selector      labelSelector
	template      *podTemplate
	// deployment or statefulSet is the object itself, the other nil.
	deployment  *deployment
	statefulSet *statefulSet
}

type servicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort string `yaml:"targetPort"`
	Protocol   string `yaml:"protocol"`
}

type service struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		Type                     string            `yaml:"type"`
		ClusterIP                string            `yaml:"clusterIP"`
		PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
		SessionAffinity          string            `yaml:"sessionAffinity"`
		Selector                 map[string]string `yaml:"selector"`
		Ports                    []servicePort     `yaml:"ports"`
	} `yaml:"spec"`
}

type relabeling struct {
	Action       string   `yaml:"action"`
	SourceLabels []string `yaml:"sourceLabels"`
	Separator    string   `yaml:"separator"`
	Regex        string   `yaml:"regex"`
	TargetLabel  string   `yaml:"targetLabel"`
	Replacement  string   `yaml:"replacement"`
}

type serviceMonitor struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		JobLabel string `yaml:"jobLabel"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		NamespaceSelector *struct {
			MatchNames []string `yaml:"matchNames"`
		} `yaml:"namespaceSelector"`
		Endpoints []struct {
			Port                 string       `yaml:"port"`
			Path                 string       `yaml:"path"`
			Scheme               string       `yaml:"scheme"`
			Interval             string       `yaml:"interval"`
			ScrapeTimeout        string       `yaml:"scrapeTimeout"`
			HonorLabels          bool         `yaml:"honorLabels"`
			Relabelings          []relabeling `yaml:"relabelings"`
			MetricRelabelings    []relabeling `yaml:"metricRelabelings"`
			BearerTokenSecretRef any          `yaml:"bearerTokenSecret"`
		} `yaml:"endpoints"`
	} `yaml:"spec"`
}

type prometheusRule struct {
	typeMeta `yaml:",inline"`
	Spec     struct {
		Groups []any `yaml:"groups"`
	} `yaml:"spec"`
}

// kinds are the known kinds, with their apiVersion and the type their documents decode into.
var kinds = map[string]struct {
	apiVersion string
	namespaced bool
	decode     func(doc) (any, error)
}{
	"Namespace":             {"v1", false, decodeAs[namespace]},
	"Secret":                {"v1", true, decodeAs[secret]},
	"ConfigMap":             {"v1", true, decodeAs[configMap]},
	"PersistentVolumeClaim": {"v1", true, decodeAs[persistentVolumeClaim]},
	"Service":               {"v1", true, decodeAs[service]},
	"Deployment":            {"apps/v1", true, decodeAs[deployment]},
	"StatefulSet":           {"apps/v1", true, decodeAs[statefulSet]},
	"PodDisruptionBudget":   {"policy/v1", true, decodeAs[podDisruptionBudget]},
	"ServiceMonitor":        {"monitoring.coreos.com/v1", true, decodeAs[serviceMonitor]},
	"PrometheusRule":        {"monitoring.coreos.com/v1", true, decodeAs[prometheusRule]},
}

// doc is one YAML document of a manifest file.
type doc struct {
	file  string
	index int
	node  *yaml.Node
	typeMeta
}

func (d doc) String() string {
	return fmt.Sprintf("%s (document %d, %s %q)", d.file, d.index, d.Kind, d.Metadata.Name)
}

// strictDecode decodes data into v, refusing fields v does not declare.
func strictDecode(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	return dec.Decode(v)
}

func decodeAs[T any](d doc) (any, error) {
	data, err := yaml.Marshal(d.node)
	if err != nil {
		return nil, err
	}
	var v T
	if err := strictDecode(data, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// readDocs reads every YAML document of the files directly in each dir (not its subdirectories,
// as `kubectl apply -f DIR` does), or of each file named.
func readDocs(t *testing.T, paths ...string) []doc {
	t.Helper()
	var docs []doc
	for _, dir := range paths {
		files := []string{dir}
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			files = files[:0]
			for _, e := range entries {
				if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") {
					files = append(files, filepath.Join(dir, e.Name()))
				}
			}
		}
		for _, p := range files {
			d, err := readFileDocs(p)
			require.NoError(t, err)
			docs = append(docs, d...)
		}
	}
	return docs
}

func readFileDocs(p string) ([]doc, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var docs []doc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for i := 0; ; i++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s document %d: %w", p, i, err)
		}
		if len(n.Content) == 0 || n.Content[0].Kind == yaml.ScalarNode && n.Content[0].Tag == "!!null" {
			continue // an empty document (a leading ---)
		}
		d := doc{file: p, index: i, node: &n}
		if err := n.Decode(&d.typeMeta); err != nil {
			return nil, fmt.Errorf("%s document %d: %w", p, i, err)
		}
		docs = append(docs, d)
	}
	return docs, nil
}

// A mode is what one `kubectl apply` of deploy/README.md creates: the shared files at the top of
// kubernetes/ and one subdirectory, plus the Secret template (created out of band, documenting
// the keys the pods read).
type mode struct {
	name string
	dirs []string
}

var (
	single     = mode{"single", []string{kubernetesDir, kubernetesDir + "/single", kubernetesDir + "/secret-template"}}
	replicated = mode{"replicated", []string{kubernetesDir, kubernetesDir + "/replicated", kubernetesDir + "/secret-template"}}
	modes      = []mode{single, replicated}
)

// forEachMode runs f as a subtest per mode, with that mode's manifests.
func forEachMode(t *testing.T, f func(t *testing.T, m manifests)) {
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) { f(t, loadManifests(t, md)) })
	}
}

// manifests are the decoded objects of one mode, by name.
type manifests struct {
	mode            string
	namespaces      []*namespace
	secrets         map[string]*secret
	configMaps      map[string]*configMap
	claims          map[string]*persistentVolumeClaim
	services        map[string]*service
	deployments     map[string]*deployment
	statefulSets    map[string]*statefulSet
	budgets         map[string]*podDisruptionBudget
	serviceMonitors map[string]*serviceMonitor
	prometheusRules map[string]*prometheusRule
}

func loadManifests(t *testing.T, md mode) manifests {
	t.Helper()
	m := manifests{mode: md.name, secrets: map[string]*secret{}, configMaps: map[string]*configMap{},
		claims: map[string]*persistentVolumeClaim{}, services: map[string]*service{},
		deployments: map[string]*deployment{}, statefulSets: map[string]*statefulSet{},
		budgets: map[string]*podDisruptionBudget{}, serviceMonitors: map[string]*serviceMonitor{},
		prometheusRules: map[string]*prometheusRule{}}
	for _, d := range readDocs(t, md.dirs...) {
		k, ok := kinds[d.Kind]
		require.True(t, ok, "%v: unknown kind", d)
		v, err := k.decode(d)
		require.NoError(t, err, "%v", d)
		switch o := v.(type) {
		case *namespace:
			m.namespaces = append(m.namespaces, o)
		case *secret:
			m.secrets[o.Metadata.Name] = o
		case *configMap:
			m.configMaps[o.Metadata.Name] = o
		case *persistentVolumeClaim:
			m.claims[o.Metadata.Name] = o
		case *service:
			m.services[o.Metadata.Name] = o
		case *deployment:
			m.deployments[o.Metadata.Name] = o
		case *statefulSet:
			m.statefulSets[o.Metadata.Name] = o
		case *podDisruptionBudget:
			m.budgets[o.Metadata.Name] = o
		case *serviceMonitor:
			m.serviceMonitors[o.Metadata.Name] = o
		case *prometheusRule:
			m.prometheusRules[o.Metadata.Name] = o
		}
	}
	return m
}

// workloads are the mode's Deployments and StatefulSets.
func (m manifests) workloads() []workload {
	var out []workload
	for name, d := range m.deployments {
		out = append(out, workload{kind: "Deployment", name: name, replicas: replicasOf(d.Spec.Replicas),
			replicasField: d.Spec.Replicas, selector: d.Spec.Selector, template: &d.Spec.Template, deployment: d})
	}
	for name, s := range m.statefulSets {
		out = append(out, workload{kind: "StatefulSet", name: name, replicas: replicasOf(s.Spec.Replicas),
			replicasField: s.Spec.Replicas, selector: s.Spec.Selector, template: &s.Spec.Template, statefulSet: s})
	}
	return out
}

// workload returns the Deployment or StatefulSet called name (exactly one).
func (m manifests) workload(t *testing.T, name string) workload {
	t.Helper()
	var out []workload
	for _, w := range m.workloads() {
		if w.name == name {
			out = append(out, w)
		}
	}
	require.Len(t, out, 1, "one Deployment or StatefulSet %s", name)
	return out[0]
}

func replicasOf(r *int) int {
	if r == nil {
		return 1 // the API server's default
	}
	return *r
}

// TestEveryManifestIsInAMode: a YAML file under kubernetes/ that no mode applies would never be
// tested as part of a deployment. The examples no mode applies (exampleDirs) have their own tests.
func TestEveryManifestIsInAMode(t *testing.T) {
	err := filepath.WalkDir(kubernetesDir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		if ext := filepath.Ext(p); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		in := slices.ContainsFunc(modes, func(md mode) bool { return slices.Contains(md.dirs, filepath.Dir(p)) })
		assert.True(t, in || slices.Contains(exampleDirs, filepath.Dir(p)), "%s is in no mode's directories nor an example's", p)
		return nil
	})
	require.NoError(t, err)
}

func TestManifestsAreWellFormed(t *testing.T) {
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			docs := readDocs(t, md.dirs...)
			require.NotEmpty(t, docs)
			var namespaces []string
			for _, d := range docs {
				if d.Kind == "Namespace" {
					namespaces = append(namespaces, d.Metadata.Name)
				}
			}
			seen := map[string]string{}
			for _, d := range docs {
				t.Run(fmt.Sprintf("%s/%d", strings.TrimPrefix(d.file, kubernetesDir+"/"), d.index), func(t *testing.T) {
					require.NotEmpty(t, d.APIVersion, "%v: apiVersion", d)
					require.NotEmpty(t, d.Kind, "%v: kind", d)
					require.NotEmpty(t, d.Metadata.Name, "%v: metadata.name", d)
					k, ok := kinds[d.Kind]
					require.True(t, ok, "%v: unknown kind", d)
					assert.Equal(t, k.apiVersion, d.APIVersion, "%v: apiVersion", d)
					_, err := k.decode(d)
					assert.NoError(t, err, "%v", d)
					if k.namespaced {
						assert.NotEmpty(t, d.Metadata.Namespace, "%v: metadata.namespace", d)
						if len(namespaces) > 0 {
							assert.Contains(t, namespaces, d.Metadata.Namespace, "%v: a namespace the manifests create", d)
						}
					}
					id := d.Kind + "/" + d.Metadata.Namespace + "/" + d.Metadata.Name
					assert.NotContains(t, seen, id, "%v: also defined in %s", d, seen[id])
					seen[id] = d.String()
				})
			}
		})
	}
}

// TestStrictDecodingCatchesTypos shows the schema check is not a no-op: a misspelt field fails.
func TestStrictDecodingCatchesTypos(t *testing.T) {
	for _, tc := range []struct{ name, yaml string }{
		{"replicas", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 1}\n"},
		{"mountPath", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {template: {spec: {containers: [{name: c, volumeMounts: [{name: v, mountpath: /x}]}]}}}\n"},
		{"honorLabels", "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec: {endpoints: [{port: p, honor_labels: true}]}\n"},
		{"minAvailable", "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: x}\nspec: {minAvailible: 2}\n"},
		{"volumeClaimTemplates", "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec: {volumeClaimTemplate: []}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n yaml.Node
			require.NoError(t, yaml.Unmarshal([]byte(tc.yaml), &n))
			d := doc{file: "inline", node: &n}
			require.NoError(t, n.Decode(&d.typeMeta))
			_, err := kinds[d.Kind].decode(d)
			assert.Error(t, err)
		})
	}
}

// configFile finds the file a container's `--config` names: in the ConfigMap mounted there, or,
// when an init container writes it onto a shared emptyDir, as that init container renders it
// (renderConfig).
func configFile(t *testing.T, m manifests, w workload, c container) (subcommand, data string) {
	t.Helper()
	require.GreaterOrEqual(t, len(c.Args), 3, "%s: args", w.name)
	i := slices.Index(c.Args, "--config")
	require.True(t, i >= 0 && i+1 < len(c.Args), "%s: args %q have no --config FILE", w.name, c.Args)
	file := c.Args[i+1]
	pod := &w.template.Spec
	mnt, v := mountOf(pod, c, file)
	require.NotNil(t, v, "%s: %s is on no volume", w.name, file)
	if v.EmptyDir != nil {
		return c.Args[0], renderConfig(t, m, w, v.Name, file, mnt, testPodIP)
	}
	require.NotNil(t, v.ConfigMap, "%s: %s is not on a ConfigMap volume", w.name, file)
	return c.Args[0], configMapFile(t, m, w.name, v, mnt, file)
}

// configMapFile is the content of file, which lies on the ConfigMap volume v mounted at mnt.
func configMapFile(t *testing.T, m manifests, workloadName string, v *volume, mnt volumeMount, file string) string {
	t.Helper()
	cm, ok := m.configMaps[v.ConfigMap.Name]
	require.True(t, ok, "%s: ConfigMap %q is not defined", workloadName, v.ConfigMap.Name)
	key := strings.TrimPrefix(file, strings.TrimSuffix(mnt.MountPath, "/")+"/")
	if mnt.SubPath != "" {
		key = mnt.SubPath
	}
	for _, it := range v.ConfigMap.Items {
		if it.Path == key {
			key = it.Key
		}
	}
	data, ok := cm.Data[key]
	require.True(t, ok, "%s: ConfigMap %q has no key %q for %s", workloadName, cm.Metadata.Name, key, file)
	return data
}

// mountOf returns the mount and volume a path in the container lives on (the deepest mount).
func mountOf(pod *podSpec, c container, file string) (volumeMount, *volume) {
	var best volumeMount
	for _, vm := range c.VolumeMounts {
		mp := strings.TrimSuffix(vm.MountPath, "/")
		if (file == mp || strings.HasPrefix(file, mp+"/")) && len(mp) > len(best.MountPath) {
			best = vm
		}
	}
	for i, v := range pod.Volumes {
		if v.Name == best.Name && best.Name != "" {
			return best, &pod.Volumes[i]
		}
	}
	return best, nil
}

// requireSecretFile checks that a file a config names comes from a Secret volume whose key exists,
// and returns the key.
func requireSecretFile(t *testing.T, m manifests, pod *podSpec, c container, field, file string) string {
	t.Helper()
	require.NotEmpty(t, file, "%s: %s is empty", c.Name, field)
	mnt, v := mountOf(pod, c, file)
	require.NotNil(t, v, "%s: %s %s is on no volume", c.Name, field, file)
	require.NotNil(t, v.Secret, "%s: %s %s is not on a Secret volume", c.Name, field, file)
	s, ok := m.secrets[v.Secret.SecretName]
	require.True(t, ok, "%s: Secret %q is not defined", c.Name, v.Secret.SecretName)
	rel := strings.TrimPrefix(file, strings.TrimSuffix(mnt.MountPath, "/")+"/")
	key := rel
	if len(v.Secret.Items) > 0 {
		key = ""
		for _, it := range v.Secret.Items {
			if it.Path == rel {
				key = it.Key
			}
		}
		require.NotEmpty(t, key, "%s: %s %s is not among the Secret volume's items", c.Name, field, file)
	}
	assert.True(t, s.has(key), "%s: %s: Secret %q has no key %q", c.Name, field, s.Metadata.Name, key)
	return key
}

// requireClaimDir checks that a directory a config names is on a PersistentVolumeClaim defined here.
func requireClaimDir(t *testing.T, m manifests, pod *podSpec, c container, field, dir string) {
	t.Helper()
	_, v := mountOf(pod, c, dir)
	require.NotNil(t, v, "%s: %s %s is on no volume", c.Name, field, dir)
	require.NotNil(t, v.PersistentVolumeClaim, "%s: %s %s is not on a PersistentVolumeClaim: it would not survive the pod", c.Name, field, dir)
	_, ok := m.claims[v.PersistentVolumeClaim.ClaimName]
	assert.True(t, ok, "%s: PersistentVolumeClaim %q is not defined", c.Name, v.PersistentVolumeClaim.ClaimName)
}

// requireEmptyDir checks that a directory a config names is on the pod's own emptyDir volume.
func requireEmptyDir(t *testing.T, pod *podSpec, c container, field, dir string) {
	t.Helper()
	mnt, v := mountOf(pod, c, dir)
	require.NotNil(t, v, "%s: %s %s is on no volume", c.Name, field, dir)
	assert.NotNil(t, v.EmptyDir, "%s: %s %s: want the pod's own emptyDir, got volume %q", c.Name, field, dir, v.Name)
	assert.False(t, mnt.ReadOnly, "%s: %s %s is mounted read-only", c.Name, field, dir)
}

// requireListenPort checks that a listen address binds every address on a declared container port.
func requireListenPort(t *testing.T, c container, field, addr, portName string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err, "%s: %s", c.Name, field)
	assert.Contains(t, []string{"", "0.0.0.0", "::"}, host, "%s: %s %s: loopback is unreachable from other pods", c.Name, field, addr)
	want, ok := c.port(portName)
	require.True(t, ok, "%s: no container port %q", c.Name, portName)
	assert.Equal(t, strconv.Itoa(want), port, "%s: %s and container port %q", c.Name, field, portName)
}

// serviceFor returns the Service at an in-cluster URL's host (name, name.ns, name.ns.svc[.…]).
func serviceFor(t *testing.T, m manifests, rawURL string) (*service, int) {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	name := strings.Split(u.Hostname(), ".")[0]
	s, ok := m.services[name]
	require.True(t, ok, "%s: no Service %q", rawURL, name)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err, "%s: port", rawURL)
	return s, port
}

// requireServicePort checks that rawURL names a Service of the mode that selects workload w, on a
// port whose target is the container port portName.
func requireServicePort(t *testing.T, m manifests, field, rawURL string, w *podTemplate, portName string) {
	t.Helper()
	s, port := serviceFor(t, m, rawURL)
	assert.True(t, selects(s.Spec.Selector, w.Metadata.Labels), "%s %s: Service %s does not select the pods", field, rawURL, s.Metadata.Name)
	assert.True(t, slices.ContainsFunc(s.Spec.Ports, func(p servicePort) bool {
		return p.Port == port && p.TargetPort == portName
	}), "%s %s: not Service %s's port for %q", field, rawURL, s.Metadata.Name, portName)
}

// basinContainer is the one container of a basin Deployment or StatefulSet.
func basinContainer(t *testing.T, m manifests, name string) (workload, container) {
	t.Helper()
	w := m.workload(t, name)
	require.Len(t, w.template.Spec.Containers, 1)
	return w, w.template.Spec.Containers[0]
}

// gatewayConfig returns the gateway's embedded configuration, through the gateway's parser.
func gatewayConfig(t *testing.T, m manifests) *gateway.Config {
	t.Helper()
	d, c := basinContainer(t, m, "basin-gateway")
	_, data := configFile(t, m, d, c)
	cfg, err := gateway.ParseConfig([]byte(data))
	require.NoError(t, err)
	return cfg
}

// daemonConfig returns the daemon's embedded configuration, through the daemon's parser, and its
// store block (parseDaemonConfig).
func daemonConfig(t *testing.T, m manifests) (*daemon.Config, store.Config) {
	t.Helper()
	d, c := basinContainer(t, m, "basin-daemon")
	_, data := configFile(t, m, d, c)
	return parseDaemonConfig(t, data)
}

func TestDeployments(t *testing.T) {
	forEachMode(t, func(t *testing.T, m manifests) {
		basins := 0
		for _, w := range m.workloads() {
			if isBasin(w.template.Spec.Containers[0]) {
				basins++
			}
		}
		require.Equal(t, 2, basins, "the gateway and the daemon")
		for _, tc := range []struct{ name, subcommand string }{
			{"basin-gateway", "gateway"},
			{"basin-daemon", "daemon"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				d, c := basinContainer(t, m, tc.name)
				pod := &d.template.Spec
				assert.True(t, selects(d.selector.MatchLabels, d.template.Metadata.Labels), "selector must match the pod labels")
				sub, data := configFile(t, m, d, c)
				assert.Equal(t, tc.subcommand, sub, "args[0]")
				for _, ct := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
					for _, vm := range ct.VolumeMounts {
						assert.True(t, slices.ContainsFunc(pod.Volumes, func(v volume) bool { return v.Name == vm.Name }),
							"%s: volumeMount %q has no volume", ct.Name, vm.Name)
					}
				}
				for _, p := range []*probe{c.ReadinessProbe, c.LivenessProbe} {
					if p != nil && p.HTTPGet != nil {
						_, ok := c.port(p.HTTPGet.Port)
						assert.True(t, ok, "probe port %q is not a container port", p.HTTPGet.Port)
					}
				}
				require.NotNil(t, d.replicasField, "replicas: the default is 1, but say it")
				switch tc.subcommand {
				case "gateway":
					cfg, err := gateway.ParseConfig([]byte(data))
					require.NoError(t, err)
					requireListenPort(t, c, "listen", cfg.Listen, "openai")
					requireListenPort(t, c, "admin_listen", cfg.AdminListen, "admin")
					requireSecretFile(t, m, pod, c, "admin_token_file", cfg.AdminTokenFile)
					if m.mode == single.name {
						assert.False(t, cfg.Store.Enabled(), "single mode has no store")
						require.NotEmpty(t, cfg.StateFile, "state_file: live sessions would not survive a restart")
						requireClaimDir(t, m, pod, c, "state_file", path.Dir(cfg.StateFile))
					} else {
						require.True(t, cfg.Store.Enabled(), "replicated mode needs store.url")
					}
				case "daemon":
					cfg, sc := parseDaemonConfig(t, data)
					requireListenPort(t, c, "listen", cfg.Listen, "http")
					requireSecretFile(t, m, pod, c, "token_file", cfg.TokenFile)
					requireSecretFile(t, m, pod, c, "gateway.token_file", cfg.Gateway.TokenFile)
					if m.mode == single.name {
						assert.False(t, sc.Enabled(), "single mode has no store")
						requireClaimDir(t, m, pod, c, "data_dir", cfg.DataDir)
						if cfg.Calibration != "" { // knee_reestimate writes it back: not on a ConfigMap
							requireClaimDir(t, m, pod, c, "calibration", path.Dir(cfg.Calibration))
						}
					} else {
						require.True(t, sc.Enabled(), "replicated mode needs store.url")
						// Each pod its own: the lock on data_dir never holds a rolling update back.
						requireEmptyDir(t, pod, c, "data_dir", cfg.DataDir)
						assert.Empty(t, cfg.Calibration, "calibration would be on one pod's emptyDir only")
					}
					// The daemon addresses the gateway through its admin Service: in replicated mode
					// a follower forwards /admin/* to the leader.
					gw := m.workload(t, "basin-gateway")
					requireServicePort(t, m, "gateway.admin_url", cfg.Gateway.AdminURL, gw.template, "admin")
				}
			})
		}
	})
}

// TestSingleModeRunsOneOfEach: without a store each gateway has its own budget and two daemons
// would fight, so single mode runs one of each, and Recreate so that two never overlap.
func TestSingleModeRunsOneOfEach(t *testing.T) {
	m := loadManifests(t, single)
	for name, d := range m.deployments {
		t.Run(name, func(t *testing.T) {
			require.NotNil(t, d.Spec.Replicas)
			assert.Equal(t, 1, *d.Spec.Replicas)
			assert.Equal(t, "Recreate", d.Spec.Strategy.Type)
		})
	}
	assert.Empty(t, m.statefulSets, "no store in single mode")
	assert.Empty(t, m.budgets, "a budget on one replica would block every drain")
}

// TestSecretReferences checks every environment variable and Secret key the pods use.
func TestSecretReferences(t *testing.T) {
	forEachMode(t, func(t *testing.T, m manifests) {
		require.Len(t, m.secrets, 1, "one Secret manifest, documenting the keys")
		for _, s := range m.secrets {
			assert.Empty(t, s.Data, "Secret %s: no values in the repository", s.Metadata.Name)
			for k, v := range s.StringData {
				assert.Empty(t, v, "Secret %s key %s: no values in the repository", s.Metadata.Name, k)
			}
		}
		for _, w := range m.workloads() {
			pod := &w.template.Spec
			for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
				for _, e := range c.Env {
					if isBasin(c) {
						assert.Contains(t, knownEnv, e.Name, "%s: environment variable %q is not one basin reads", w.name, e.Name)
					}
					if e.ValueFrom == nil {
						continue
					}
					if f := e.ValueFrom.FieldRef; f != nil {
						assert.Contains(t, []string{"status.podIP", "metadata.name"}, f.FieldPath, "%s: %s", w.name, e.Name)
						continue
					}
					ref := e.ValueFrom.SecretKeyRef
					require.NotNil(t, ref, "%s: %s: only secretKeyRef and fieldRef are used", w.name, e.Name)
					s, ok := m.secrets[ref.Name]
					require.True(t, ok, "%s: %s: Secret %q is not defined", w.name, e.Name, ref.Name)
					assert.True(t, s.has(ref.Key), "%s: %s: Secret %q has no key %q", w.name, e.Name, ref.Name, ref.Key)
				}
			}
			for _, v := range pod.Volumes {
				if v.Secret == nil {
					continue
				}
				s, ok := m.secrets[v.Secret.SecretName]
				require.True(t, ok, "%s: volume %s: Secret %q is not defined", w.name, v.Name, v.Secret.SecretName)
				for _, it := range v.Secret.Items {
					assert.True(t, s.has(it.Key), "%s: volume %s: Secret %q has no key %q", w.name, v.Name, s.Metadata.Name, it.Key)
				}
			}
		}
	})
}

// isBasin reports whether a container runs the basin binary (its args start with a subcommand).
func isBasin(c container) bool {
	return len(c.Args) > 0 && (c.Args[0] == "gateway" || c.Args[0] == "daemon")
}

// selects reports whether a label selector matches a set of labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestServices(t *testing.T) {
	forEachMode(t, func(t *testing.T, m manifests) {
		require.NotEmpty(t, m.services)
		for name, s := range m.services {
			t.Run(name, func(t *testing.T) {
				var targets []workload
				for _, w := range m.workloads() {
					if selects(s.Spec.Selector, w.template.Metadata.Labels) {
						targets = append(targets, w)
					}
				}
				require.Len(t, targets, 1, "the Service must select exactly one Deployment or StatefulSet")
				c := targets[0].template.Spec.Containers[0]
				for _, p := range s.Spec.Ports {
					_, ok := c.port(p.TargetPort)
					if n, err := strconv.Atoi(p.TargetPort); !ok && err == nil {
						ok = slices.ContainsFunc(c.Ports, func(cp containerPort) bool { return cp.ContainerPort == n })
					}
					assert.True(t, ok, "port %s: targetPort %q is not a container port of %s", p.Name, p.TargetPort, targets[0].name)
				}
			})
		}
	})
}

func TestServiceMonitors(t *testing.T) {
	forEachMode(t, func(t *testing.T, m manifests) {
		cfg, _ := daemonConfig(t, m)
		deploymentLabel := cfg.Deployment
		jobs := map[string]bool{}
		for name, sm := range m.serviceMonitors {
			t.Run(name, func(t *testing.T) {
				var svcs []*service
				for _, s := range m.services {
					if s.Metadata.Namespace == sm.Metadata.Namespace && selects(sm.Spec.Selector.MatchLabels, s.Metadata.Labels) {
						svcs = append(svcs, s)
					}
				}
				require.Len(t, svcs, 1, "the ServiceMonitor must select exactly one Service")
				s := svcs[0]
				require.NotEmpty(t, sm.Spec.Endpoints)
				for _, ep := range sm.Spec.Endpoints {
					assert.True(t, slices.ContainsFunc(s.Spec.Ports, func(p servicePort) bool {
						return p.Name == ep.Port
					}), "endpoint port %q is not a port of Service %s", ep.Port, s.Metadata.Name)
					labels := map[string]string{"job": s.Metadata.Name} // the operator's default job
					for _, r := range ep.Relabelings {
						if (r.Action == "" || r.Action == "replace") && len(r.SourceLabels) == 0 {
							labels[r.TargetLabel] = r.Replacement
						}
					}
					assert.Equal(t, deploymentLabel, labels["deployment"], "the deployment label must equal the daemon's deployment:")
					job := labels["job"]
					assert.Contains(t, []string{daemonJob, gatewayJob}, job, "rules/basin.rules.yml expects these job names")
					jobs[job] = true
					// The daemon's own deployment label must win over the target's.
					assert.Equal(t, job == daemonJob, ep.HonorLabels, "honorLabels for job %s", job)
					// Every replica is its own target: a relabeling that replaced instance (or
					// dropped targets) would merge the replicas' series or lose some.
					for _, r := range ep.Relabelings {
						assert.NotEqual(t, "instance", r.TargetLabel, "instance must stay per pod")
						assert.NotContains(t, []string{"keep", "drop"}, r.Action, "every pod behind the Service is scraped")
					}
				}
			})
		}
		assert.True(t, jobs[daemonJob] && jobs[gatewayJob], "both %s and %s are scraped: %v", daemonJob, gatewayJob, jobs)
	})
}

func TestPrometheusRuleIsRulesFile(t *testing.T) {
	m := loadManifests(t, single)
	require.Len(t, m.prometheusRules, 1)
	data, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	var rules map[string]any
	require.NoError(t, yaml.Unmarshal(data, &rules))
	require.Len(t, rules, 1, "the rules file has only groups")
	want, ok := rules["groups"].([]any)
	require.True(t, ok, "groups")
	for _, pr := range m.prometheusRules {
		// Round-trip the decoded groups through the same generic decoding as the rules file.
		b, err := yaml.Marshal(pr.Spec.Groups)
		require.NoError(t, err)
		var got []any
		require.NoError(t, yaml.Unmarshal(b, &got))
		assert.Equal(t, want, got, "PrometheusRule %s: regenerate it from %s (see its header)", pr.Metadata.Name, rulesFile)
	}
}

// unit is a systemd unit file: section → key → values in order.
type unit map[string]map[string][]string

// parseUnit reads a unit file as INI text: [Section], Key=Value, # and ; comments, a trailing
// backslash continues a line.
func parseUnit(data []byte) (unit, error) {
	u := unit{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	lineNo := 0
	var cont strings.Builder
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if cont.Len() == 0 && (line == "" || line[0] == '#' || line[0] == ';') {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cont.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cont.WriteString(line)
		line = cont.String()
		cont.Reset()
		if strings.HasPrefix(line, "[") {
			if !strings.HasSuffix(line, "]") {
				return nil, fmt.Errorf("line %d: bad section header %q", lineNo, line)
			}
			section = line[1 : len(line)-1]
			if _, dup := u[section]; dup {
				return nil, fmt.Errorf("line %d: section [%s] twice", lineNo, section)
			}
			u[section] = map[string][]string{}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			return nil, fmt.Errorf("line %d: want Key=Value in a section, got %q", lineNo, line)
		}
		k = strings.TrimSpace(k)
		u[section][k] = append(u[section][k], strings.TrimSpace(v))
	}
	return u, sc.Err()
}

func TestSystemdUnits(t *testing.T) {
	for _, tc := range []struct{ file, subcommand string }{
		{"basin-gateway.service", "gateway"},
		{"basin-daemon.service", "daemon"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(systemdDir, tc.file))
			require.NoError(t, err)
			u, err := parseUnit(data)
			require.NoError(t, err)
			require.Contains(t, u, "Unit")
			require.Contains(t, u, "Service")
			require.Contains(t, u, "Install")
			svc := u["Service"]
			require.Len(t, svc["ExecStart"], 1, "one ExecStart")
			args := strings.Fields(svc["ExecStart"][0])
			require.Len(t, args, 4, "ExecStart %q", svc["ExecStart"][0])
			assert.True(t, path.IsAbs(args[0]) && path.Base(args[0]) == "basin", "ExecStart runs the basin binary by absolute path: %q", args[0])
			assert.Equal(t, []string{tc.subcommand, "--config"}, args[1:3], "ExecStart: basin %s --config FILE", tc.subcommand)
			assert.Equal(t, "/etc/basin/"+tc.subcommand+".yaml", args[3], "the config lives in the ConfigurationDirectory")
			for k, want := range map[string]string{
				"Restart":                "on-failure",
				"DynamicUser":            "yes",
				"NoNewPrivileges":        "yes",
				"ProtectSystem":          "strict",
				"ProtectHome":            "yes",
				"PrivateTmp":             "yes",
				"ConfigurationDirectory": "basin",
				"StateDirectory":         "basin-" + tc.subcommand,
				"CapabilityBoundingSet":  "",
			} {
				assert.Equal(t, []string{want}, svc[k], "[Service] %s", k)
			}
			for _, c := range svc["LoadCredential"] {
				id, src, ok := strings.Cut(c, ":")
				assert.True(t, ok && id != "" && strings.HasPrefix(src, "/etc/basin/credentials/"), "LoadCredential=%s", c)
			}
			assert.NotEmpty(t, svc["LoadCredential"], "secrets as credentials")
			assert.Equal(t, []string{"multi-user.target"}, u["Install"]["WantedBy"])
		})
	}
}

// TestSystemdAnalyzeVerify runs systemd-analyze verify on the units, with ExecStart pointed at a
// stand-in executable (verify insists the binary exists). Any output — an unknown key, a bad
// value — fails.
func TestSystemdAnalyzeVerify(t *testing.T) {
	bin, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not on PATH")
	}
	dir := t.TempDir()
	stub := filepath.Join(dir, "basin")
	require.NoError(t, os.WriteFile(stub, []byte("#!/bin/sh\n"), 0o755))
	units, err := filepath.Glob(filepath.Join(systemdDir, "*.service"))
	require.NoError(t, err)
	require.Len(t, units, 2)
	var paths []string
	for _, f := range units {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		u, err := parseUnit(data)
		require.NoError(t, err)
		orig := strings.Fields(u["Service"]["ExecStart"][0])[0]
		p := filepath.Join(dir, filepath.Base(f))
		require.NoError(t, os.WriteFile(p, bytes.ReplaceAll(data, []byte("ExecStart="+orig), []byte("ExecStart="+stub)), 0o644))
		paths = append(paths, p)
	}
	// The replicated mode's drop-ins, where systemd looks for them: verify reads them when the
	// directory is on the unit path.
	dropIns, err := filepath.Glob(filepath.Join(systemdDir, "replicated", "*.service.d", "*.conf"))
	require.NoError(t, err)
	require.Len(t, dropIns, 2)
	for _, f := range dropIns {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		d := filepath.Join(dir, filepath.Base(filepath.Dir(f)))
		require.NoError(t, os.MkdirAll(d, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(d, filepath.Base(f)), data, 0o644))
	}
	cmd := exec.Command(bin, append([]string{"verify", "--man=no"}, paths...)...)
	cmd.Env = append(os.Environ(), "SYSTEMD_UNIT_PATH="+dir+":")
	out, err := cmd.CombinedOutput()
	assert.NoError(t, err, "systemd-analyze verify:\n%s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "systemd-analyze verify")
}

// TestDaemonServiceReachesABlindDaemon: a blind daemon answers /readyz 503, and Alertmanager's
// webhook must still reach it through its Service then.
func TestDaemonServiceReachesABlindDaemon(t *testing.T) {
	forEachMode(t, func(t *testing.T, m manifests) {
		svc, ok := m.services["basin-daemon"]
		require.True(t, ok, "the daemon's Service")
		assert.True(t, svc.Spec.PublishNotReadyAddresses, "publishNotReadyAddresses: true")
	})
}

package scaler

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/basin-dev/basin/internal/yamlconf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// request is a decode scale-up as the daemon's policy makes them.
func request() Request {
	return Request{Deployment: "prod", Role: RoleDecode, Replicas: 3, Seq: 42,
		Reason: "trapped: working set 1.4M > cache 1.1M tokens, hit rate 0.31 < 0.6"}
}

// writeFile writes content to name in a new temporary directory and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// caFile writes cert as a PEM file, as a ca.crt is mounted.
func caFile(t *testing.T, cert *x509.Certificate) string {
	t.Helper()
	return writeFile(t, "ca.crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})))
}

// someCA writes a new self-signed CA certificate: valid, and the signer of no server (every
// httptest TLS server shares one certificate, so it cannot stand for another CA).
func someCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return caFile(t, cert)
}

func TestNewBackendErrors(t *testing.T) {
	tok := writeFile(t, "token", "s3cret-token\n")
	empty := writeFile(t, "empty-token", " \n")
	ca := someCA(t)
	notPEM := writeFile(t, "ca.crt", "not a certificate")
	missing := filepath.Join(t.TempDir(), "nope")
	kube := func(mutate func(*KubernetesConfig)) BackendConfig {
		k := KubernetesConfig{APIServer: "https://10.0.0.1:6443", TokenFile: tok, CAFile: ca, Namespace: "llm",
			Targets: map[Role]ScaleTarget{RoleDecode: {Kind: "StatefulSet", Name: "sglang-decode"}}}
		if mutate != nil {
			mutate(&k)
		}
		return BackendConfig{Kind: "kubernetes", Kubernetes: k}
	}
	withTop := func(cfg BackendConfig, f func(*BackendConfig)) BackendConfig { f(&cfg); return cfg }
	noEnv := func(string) string { return "" }

	tests := []struct {
		name string
		cfg  BackendConfig
		wire Wiring
		want []string
	}{
		{"no kind", BackendConfig{}, Wiring{}, []string{"kind: required, one of sim, http, exec, kubernetes"}},
		{"unknown kind", BackendConfig{Kind: "nomad"}, Wiring{}, []string{`kind: unknown "nomad"`}},
		{"sim without the switch", BackendConfig{Kind: "sim"}, Wiring{}, []string{"kind: sim needs the simulator's scaling switch"}},
		{"sim with a timeout and a url", BackendConfig{Kind: "sim", Timeout: time.Second, URL: "http://x"},
			Wiring{Sim: func(Role, int) {}}, []string{"timeout: not used by kind sim", "url: not used by kind sim"}},
		{"sim with kubernetes keys", BackendConfig{Kind: "sim", Kubernetes: KubernetesConfig{Namespace: "llm"}},
			Wiring{Sim: func(Role, int) {}}, []string{"kubernetes: not used by kind sim"}},
		{"http without url", BackendConfig{Kind: "http"}, Wiring{}, []string{"url: required, where to POST the scale requests"}},
		{"http with a relative url", BackendConfig{Kind: "http", URL: "/scale"}, Wiring{}, []string{"url: /scale: want an http or https URL"}},
		{"http url password redacted", BackendConfig{Kind: "http", URL: "ftp://u:secret@host/x"}, Wiring{},
			[]string{"url: ftp://u:xxxxx@host/x: want an http or https URL"}},
		{"http token file missing", BackendConfig{Kind: "http", URL: "http://127.0.0.1:9/x", TokenFile: missing}, Wiring{},
			[]string{"token_file: open "}},
		{"http token file empty", BackendConfig{Kind: "http", URL: "http://127.0.0.1:9/x", TokenFile: empty}, Wiring{},
			[]string{"token_file: " + empty + ": empty"}},
		{"http with a command and kubernetes keys", BackendConfig{Kind: "http", URL: "http://127.0.0.1:9/x", Command: []string{"true"},
			Kubernetes: KubernetesConfig{APIServer: "https://x"}}, Wiring{},
			[]string{"command: not used by kind http", "kubernetes: not used by kind http"}},
		{"negative timeout", BackendConfig{Kind: "http", URL: "http://127.0.0.1:9/x", Timeout: -time.Second}, Wiring{},
			[]string{"timeout: -1s, must not be negative"}},
		{"exec without command", BackendConfig{Kind: "exec"}, Wiring{}, []string{"command: required"}},
		{"exec with an empty program", BackendConfig{Kind: "exec", Command: []string{""}}, Wiring{}, []string{"command[0]: empty"}},
		{"exec program not found", BackendConfig{Kind: "exec", Command: []string{"basin-no-such-program-xyz"}}, Wiring{},
			[]string{`command[0]: exec: "basin-no-such-program-xyz"`}},
		{"exec with url and token", BackendConfig{Kind: "exec", Command: []string{"sh"}, URL: "http://x", TokenFile: empty}, Wiring{},
			[]string{"url: not used by kind exec", "token_file: not used by kind exec"}},
		{"kubernetes with the http keys", withTop(kube(nil), func(c *BackendConfig) { c.URL, c.TokenFile, c.Command = "http://x", tok, []string{"x"} }),
			Wiring{}, []string{"url: not used by kind kubernetes", "token_file: not used by kind kubernetes (its token is kubernetes.token_file)",
				"command: not used by kind kubernetes"}},
		{"kubernetes api server in clear", kube(func(k *KubernetesConfig) { k.APIServer = "http://10.0.0.1:8080" }), Wiring{},
			[]string{"kubernetes.api_server: http://10.0.0.1:8080: want https"}},
		{"kubernetes api server with credentials", kube(func(k *KubernetesConfig) { k.APIServer = "https://admin:secret@10.0.0.1" }), Wiring{},
			[]string{"kubernetes.api_server: https://admin:xxxxx@10.0.0.1: credentials in the URL"}},
		{"kubernetes api server with a query", kube(func(k *KubernetesConfig) { k.APIServer = "https://10.0.0.1/?x=1" }), Wiring{},
			[]string{"kubernetes.api_server: https://10.0.0.1/?x=1: want no query or fragment"}},
		{"kubernetes api server outside a cluster", kube(func(k *KubernetesConfig) { k.APIServer = "" }), Wiring{Getenv: noEnv},
			[]string{"kubernetes.api_server: required outside a cluster (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set)"}},
		{"kubernetes token file missing", kube(func(k *KubernetesConfig) { k.TokenFile = missing }), Wiring{},
			[]string{"kubernetes.token_file: open " + missing}},
		{"kubernetes token file empty", kube(func(k *KubernetesConfig) { k.TokenFile = empty }), Wiring{},
			[]string{"kubernetes.token_file: " + empty + ": empty"}},
		{"kubernetes ca file missing", kube(func(k *KubernetesConfig) { k.CAFile = missing }), Wiring{},
			[]string{"kubernetes.ca_file: open " + missing}},
		{"kubernetes ca file not PEM", kube(func(k *KubernetesConfig) { k.CAFile = notPEM }), Wiring{},
			[]string{"kubernetes.ca_file: " + notPEM + ": no PEM certificate in it"}},
		{"kubernetes bad namespace", kube(func(k *KubernetesConfig) { k.Namespace = "LLM_prod" }), Wiring{},
			[]string{`kubernetes.namespace: "LLM_prod" is not a namespace name`}},
		{"kubernetes without targets", kube(func(k *KubernetesConfig) { k.Targets = nil }), Wiring{},
			[]string{"kubernetes.targets: required"}},
		{"kubernetes target problems", kube(func(k *KubernetesConfig) {
			k.Targets = map[Role]ScaleTarget{"router": {Kind: "Deployment", Name: "r"}, RolePrefill: {Kind: "ReplicaSet", Name: "Prefill_0"},
				RoleDecode: {}}
		}), Wiring{}, []string{
			"kubernetes.targets.decode.kind: required, Deployment or StatefulSet",
			"kubernetes.targets.decode.name: required",
			`kubernetes.targets.prefill.kind: unknown "ReplicaSet", want Deployment or StatefulSet`,
			`kubernetes.targets.prefill.name: "Prefill_0" is not an object name`,
			"kubernetes.targets.router: unknown role, want prefill or decode"}},
		{"kubernetes two roles on one object", kube(func(k *KubernetesConfig) {
			k.Targets = map[Role]ScaleTarget{RolePrefill: {Kind: "Deployment", Name: "sglang"}, RoleDecode: {Kind: "Deployment", Name: "sglang"}}
		}), Wiring{}, []string{"kubernetes.targets.prefill: the same Deployment sglang as decode"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NewBackend(tt.cfg, tt.wire)
			require.Error(t, err)
			assert.Nil(t, b)
			assert.Contains(t, err.Error(), "scaler backend: ")
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Len(t, strings.Split(err.Error(), "\n"), len(tt.want), "one line a problem, and no other: %s", err)
			assert.NotContains(t, err.Error(), "secret")
		})
	}
}

func TestNewKubernetesDefaultsOutsideACluster(t *testing.T) {
	if _, err := os.Stat(DefaultTokenFile); err == nil {
		t.Skip("running in a pod: the in-cluster defaults exist")
	}
	_, err := NewBackend(BackendConfig{Kind: "kubernetes", Kubernetes: KubernetesConfig{
		Targets: map[Role]ScaleTarget{RoleDecode: {Kind: "StatefulSet", Name: "sglang-decode"}}}},
		Wiring{Getenv: func(k string) string {
			return map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}[k]
		}})
	require.Error(t, err)
	for _, w := range []string{
		"kubernetes.token_file: open " + DefaultTokenFile,
		"kubernetes.ca_file: open " + DefaultCAFile,
		"kubernetes.namespace: open " + DefaultNamespaceFile,
		"(the in-cluster default; outside a cluster, set kubernetes.namespace)",
	} {
		assert.Contains(t, err.Error(), w)
	}
	assert.NotContains(t, err.Error(), "api_server", "the service's environment names the API server")
}

func TestNewKubernetesInClusterAPIServer(t *testing.T) {
	tok, ca := writeFile(t, "token", "tok"), someCA(t)
	tests := []struct {
		host, port, want string
	}{
		{"10.96.0.1", "443", "https://10.96.0.1:443"},
		{"fd00::1", "6443", "https://[fd00::1]:6443"},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			env := map[string]string{"KUBERNETES_SERVICE_HOST": tt.host, "KUBERNETES_SERVICE_PORT": tt.port}
			b, err := NewBackend(BackendConfig{Kind: "kubernetes", Kubernetes: KubernetesConfig{TokenFile: tok, CAFile: ca, Namespace: "llm",
				Targets: map[Role]ScaleTarget{RoleDecode: {Kind: "StatefulSet", Name: "sglang-decode"}}}},
				Wiring{Getenv: func(k string) string { return env[k] }})
			require.NoError(t, err)
			k := b.(*KubernetesBackend)
			assert.Equal(t, tt.want, k.APIServer)
			assert.Equal(t, DefaultHTTPTimeout, k.Timeout)
		})
	}
}

func TestNewBackendKinds(t *testing.T) {
	tests := []struct {
		cfg  BackendConfig
		want Backend
		wire Wiring
	}{
		{BackendConfig{Kind: "sim"}, nil, Wiring{Sim: func(Role, int) {}}},
		{BackendConfig{Kind: "http", URL: "https://capacity.example/scale"},
			&HTTPBackend{URL: "https://capacity.example/scale", Timeout: DefaultHTTPTimeout}, Wiring{}},
		{BackendConfig{Kind: "http", URL: "http://127.0.0.1:9/x", Timeout: time.Second},
			&HTTPBackend{URL: "http://127.0.0.1:9/x", Timeout: time.Second}, Wiring{}},
		{BackendConfig{Kind: "exec", Command: []string{"sh", "-c", "true"}},
			&ExecBackend{Command: []string{"sh", "-c", "true"}, Timeout: DefaultExecTimeout}, Wiring{}},
	}
	for _, tt := range tests {
		t.Run(tt.cfg.Kind, func(t *testing.T) {
			b, err := NewBackend(tt.cfg, tt.wire)
			require.NoError(t, err)
			assert.Equal(t, tt.cfg.Kind, b.Name())
			if tt.want != nil {
				assert.Equal(t, tt.want, b)
			}
		})
	}
}

// TestBackendConfigYAML reads a config the way the daemon does, strictly: the keys are the ones
// the documentation names.
func TestBackendConfigYAML(t *testing.T) {
	var cfg BackendConfig
	_, err := yamlconf.Decode([]byte(`
kind: kubernetes
timeout: 3s
kubernetes:
  api_server: https://10.96.0.1:443
  token_file: /run/basin/token
  ca_file: /run/basin/ca.crt
  namespace: llm
  targets:
    prefill: {kind: Deployment, name: sglang-prefill}
    decode: {kind: StatefulSet, name: sglang-decode}
`), &cfg)
	require.NoError(t, err)
	assert.Equal(t, BackendConfig{Kind: "kubernetes", Timeout: 3 * time.Second, Kubernetes: KubernetesConfig{
		APIServer: "https://10.96.0.1:443", TokenFile: "/run/basin/token", CAFile: "/run/basin/ca.crt", Namespace: "llm",
		Targets: map[Role]ScaleTarget{RolePrefill: {Kind: "Deployment", Name: "sglang-prefill"},
			RoleDecode: {Kind: "StatefulSet", Name: "sglang-decode"}}}}, cfg)

	cfg = BackendConfig{}
	_, err = yamlconf.Decode([]byte("kind: exec\ncommand: [scale-pool, --apply]\ntimeout: 30s\nurl: https://x\ntoken_file: t\n"), &cfg)
	require.NoError(t, err)
	assert.Equal(t, BackendConfig{Kind: "exec", Command: []string{"scale-pool", "--apply"}, Timeout: 30 * time.Second,
		URL: "https://x", TokenFile: "t"}, cfg)

	_, err = yamlconf.Decode([]byte("kind: kubernetes\nkubernetes:\n  apiserver: https://x\n"), &BackendConfig{})
	assert.ErrorContains(t, err, "apiserver", "a misspelt key is refused")
}

func TestRequestValidate(t *testing.T) {
	tests := []struct {
		name string
		r    Request
		want []string
	}{
		{"valid", request(), nil},
		{"zero replicas", Request{Role: RolePrefill}, nil},
		{"no role", Request{Replicas: 1}, []string{`scale request: role: "", want prefill or decode`}},
		{"unknown role and negative replicas", Request{Role: "router", Replicas: -1},
			[]string{`role: "router"`, "replicas: -1, must not be negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.r.Validate()
			if tt.want == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestMarshalPayload(t *testing.T) {
	b, err := MarshalPayload(request())
	require.NoError(t, err)
	assert.JSONEq(t, `{"version":1,"deployment":"prod","role":"decode","replicas":3,
		"reason":"trapped: working set 1.4M > cache 1.1M tokens, hit rate 0.31 < 0.6","seq":42}`, string(b))
	assert.Contains(t, string(b), "1.4M > cache", "the reason is not HTML-escaped")
	assert.NotContains(t, string(b), "\n")

	var p Payload
	require.NoError(t, json.Unmarshal(b, &p))
	assert.Equal(t, Payload{Version: PayloadVersion, Request: request()}, p)
}

func TestSimBackend(t *testing.T) {
	type call struct {
		role     Role
		replicas int
	}
	var calls []call
	b := SimBackend{Set: func(r Role, n int) { calls = append(calls, call{r, n}) }}
	require.NoError(t, b.Apply(context.Background(), request()))
	require.NoError(t, b.Apply(context.Background(), Request{Role: RolePrefill, Replicas: 2}))
	assert.Equal(t, []call{{RoleDecode, 3}, {RolePrefill, 2}}, calls)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, b.Apply(ctx, request()), context.Canceled)
	assert.ErrorContains(t, b.Apply(context.Background(), Request{Role: "router", Replicas: 1}), `sim: scale request: role: "router"`)
	assert.Len(t, calls, 2, "a cancelled or invalid apply does not switch")
	assert.ErrorContains(t, SimBackend{}.Apply(context.Background(), request()), "sim: no scaling switch wired")

	c, ok, err := b.Current(context.Background(), RoleDecode)
	assert.NoError(t, err)
	assert.False(t, ok, "the simulator's metrics say what runs")
	assert.Zero(t, c)
	_, _, err = b.Current(context.Background(), "router")
	assert.ErrorContains(t, err, `sim: role "router"`)
}

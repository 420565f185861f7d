package scaler

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeAPI is a Kubernetes API server that serves the apps/v1 scale subresource of a few objects,
// checks every request as the real one would (bearer token, method, path, content type, body)
// and answers with Scale and Status objects shaped as the real one's.
type fakeAPI struct {
	t   *testing.T
	srv *httptest.Server

	mu      sync.Mutex
	token   string             // the one accepted
	objects map[string]*object // by "deployments/llm/sglang-prefill"
	calls   []apiCall
	// Scripted trouble, each for the next requests.
	conflicts int           // PATCHes answered 409 Conflict
	forbidden bool          // every request answered 403
	mutate    int           // > 0: a PATCH sets this count instead (an admission webhook)
	raw       *rawAnswer    // every request answered with this
	hang      chan struct{} // requests wait for it to close
}

type object struct{ spec, status int }

// apiCall is what the fake saw of one request.
type apiCall struct {
	Method, Path, FieldManager, ContentType, Auth string
	Body                                          string
}

type rawAnswer struct {
	status int
	body   string
}

const testNS = "llm"

func newFakeAPI(t *testing.T, token string) *fakeAPI {
	t.Helper()
	f := &fakeAPI{t: t, token: token, objects: map[string]*object{
		"deployments/llm/sglang-prefill": {spec: 1, status: 1},
		"statefulsets/llm/sglang-decode": {spec: 2, status: 2},
	}}
	f.srv = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

// Scale is autoscaling/v1 Scale as the API server writes it, metadata included.
type Scale struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		Name              string `json:"name"`
		Namespace         string `json:"namespace"`
		UID               string `json:"uid"`
		ResourceVersion   string `json:"resourceVersion"`
		CreationTimestamp string `json:"creationTimestamp"`
	} `json:"metadata"`
	Spec struct {
		Replicas int `json:"replicas"`
	} `json:"spec"`
	Status struct {
		Replicas int    `json:"replicas"`
		Selector string `json:"selector"`
	} `json:"status"`
}

// Status is meta/v1 Status as the API server writes it.
type Status struct {
	Kind       string   `json:"kind"`
	APIVersion string   `json:"apiVersion"`
	Metadata   struct{} `json:"metadata"`
	Status     string   `json:"status"`
	Message    string   `json:"message"`
	Reason     string   `json:"reason"`
	Details    *struct {
		Name  string `json:"name"`
		Group string `json:"group"`
		Kind  string `json:"kind"`
	} `json:"details,omitempty"`
	Code int `json:"code"`
}

func (f *fakeAPI) status(w http.ResponseWriter, code int, reason, message string) {
	st := Status{Kind: "Status", APIVersion: "v1", Status: "Failure", Message: message, Reason: reason, Code: code}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	assert.NoError(f.t, json.NewEncoder(w).Encode(st))
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	assert.NoError(f.t, err)
	f.mu.Lock()
	f.calls = append(f.calls, apiCall{r.Method, r.URL.Path, r.URL.Query().Get("fieldManager"), r.Header.Get("Content-Type"),
		r.Header.Get("Authorization"), string(body)})
	hang := f.hang
	f.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
		panic(http.ErrAbortHandler) // a hung server answers nothing, not an empty 200
	}
	f.mu.Lock()
	defer f.mu.Unlock()

	if r.Header.Get("Authorization") != "Bearer "+f.token {
		f.status(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
		return
	}
	if f.raw != nil {
		w.WriteHeader(f.raw.status)
		_, _ = io.WriteString(w, f.raw.body)
		return
	}
	// /apis/apps/v1/namespaces/{ns}/{resource}/{name}/scale
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/apis/apps/v1/namespaces/"), "/")
	if !strings.HasPrefix(r.URL.Path, "/apis/apps/v1/namespaces/") || len(parts) != 4 || parts[3] != "scale" ||
		(parts[1] != "deployments" && parts[1] != "statefulsets") {
		f.status(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
		return
	}
	ns, resource, name := parts[0], parts[1], parts[2]
	verb := map[string]string{http.MethodGet: "get", http.MethodPatch: "patch"}[r.Method]
	if verb == "" {
		f.status(w, http.StatusMethodNotAllowed, "MethodNotAllowed", fmt.Sprintf("%s is not allowed on %s/scale", r.Method, resource))
		return
	}
	if f.forbidden {
		f.status(w, http.StatusForbidden, "Forbidden", fmt.Sprintf(`%s.apps %q is forbidden: User "system:serviceaccount:llm:basin" `+
			`cannot %s resource "%s/scale" in API group "apps" in the namespace %q`, resource, name, verb, resource, ns))
		return
	}
	obj := f.objects[resource+"/"+ns+"/"+name]
	if obj == nil {
		f.status(w, http.StatusNotFound, "NotFound", fmt.Sprintf("%s.apps %q not found", resource, name))
		return
	}
	if r.Method == http.MethodPatch {
		if ct := r.Header.Get("Content-Type"); ct != "application/merge-patch+json" {
			f.status(w, http.StatusUnsupportedMediaType, "UnsupportedMediaType", fmt.Sprintf("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml; got %q", ct))
			return
		}
		var patch struct {
			Spec struct {
				Replicas *int `json:"replicas"`
			} `json:"spec"`
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&patch); err != nil || patch.Spec.Replicas == nil {
			f.status(w, http.StatusUnprocessableEntity, "Invalid", fmt.Sprintf("the patch must set spec.replicas and nothing else: %s", body))
			return
		}
		if f.conflicts > 0 {
			f.conflicts--
			f.status(w, http.StatusConflict, "Conflict", fmt.Sprintf(`Operation cannot be fulfilled on %s.apps %q: the object has been modified; please apply your changes to the latest version and try again`, resource, name))
			return
		}
		obj.spec = *patch.Spec.Replicas
		if f.mutate > 0 {
			obj.spec = f.mutate
		}
	}
	var sc Scale
	sc.Kind, sc.APIVersion = "Scale", "autoscaling/v1"
	sc.Metadata.Name, sc.Metadata.Namespace = name, ns
	sc.Metadata.UID, sc.Metadata.ResourceVersion = "5c1e0a52-8f3b-4f2e-9a34-0d6c7f1b2a90", "48213"
	sc.Metadata.CreationTimestamp = "2026-05-01T11:00:00Z"
	sc.Spec.Replicas, sc.Status.Replicas = obj.spec, obj.status
	sc.Status.Selector = "app=sglang,role=" + strings.TrimPrefix(name, "sglang-")
	w.Header().Set("Content-Type", "application/json")
	assert.NoError(f.t, json.NewEncoder(w).Encode(sc))
}

func (f *fakeAPI) Calls() []apiCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeAPI) set(fn func(f *fakeAPI)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeAPI) spec(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.objects[key].spec
}

// kubeConfig points a kubernetes backend at f, with the token in tokenFile and f's certificate
// as the CA.
func kubeConfig(t *testing.T, f *fakeAPI, tokenFile string) BackendConfig {
	t.Helper()
	return BackendConfig{Kind: "kubernetes", Kubernetes: KubernetesConfig{
		APIServer: f.srv.URL, TokenFile: tokenFile, CAFile: caFile(t, f.srv.Certificate()), Namespace: testNS,
		Targets: map[Role]ScaleTarget{
			RolePrefill: {Kind: "Deployment", Name: "sglang-prefill"},
			RoleDecode:  {Kind: "StatefulSet", Name: "sglang-decode"},
		}}}
}

func newKube(t *testing.T, f *fakeAPI, tokenFile string) Backend {
	t.Helper()
	b, err := NewBackend(kubeConfig(t, f, tokenFile), Wiring{})
	require.NoError(t, err)
	return b
}

func TestKubernetesApplyAndCurrent(t *testing.T) {
	tests := []struct {
		role     Role
		replicas int
		path     string
		key      string
		before   Count
	}{
		{RolePrefill, 4, "/apis/apps/v1/namespaces/llm/deployments/sglang-prefill/scale", "deployments/llm/sglang-prefill", Count{1, 1}},
		{RoleDecode, 3, "/apis/apps/v1/namespaces/llm/statefulsets/sglang-decode/scale", "statefulsets/llm/sglang-decode", Count{2, 2}},
		{RoleDecode, 0, "/apis/apps/v1/namespaces/llm/statefulsets/sglang-decode/scale", "statefulsets/llm/sglang-decode", Count{2, 2}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s to %d", tt.role, tt.replicas), func(t *testing.T) {
			f := newFakeAPI(t, "sa-token-1")
			b := newKube(t, f, writeFile(t, "token", "sa-token-1\n"))
			assert.Equal(t, "kubernetes", b.Name())
			ctx := context.Background()

			c, ok, err := b.Current(ctx, tt.role)
			require.NoError(t, err)
			assert.True(t, ok)
			assert.Equal(t, tt.before, c)

			r := Request{Deployment: "prod", Role: tt.role, Replicas: tt.replicas, Reason: "trapped", Seq: 7}
			require.NoError(t, b.Apply(ctx, r))
			require.NoError(t, b.Apply(ctx, r), "level-triggered: the same request again is a no-op")
			assert.Equal(t, tt.replicas, f.spec(tt.key))

			c, ok, err = b.Current(ctx, tt.role)
			require.NoError(t, err)
			assert.True(t, ok)
			assert.Equal(t, Count{Desired: tt.replicas, Running: tt.before.Running}, c,
				"spec.replicas is what was asked, status.replicas what the controller has made so far")

			get := apiCall{http.MethodGet, tt.path, "", "", "Bearer sa-token-1", ""}
			patch := apiCall{http.MethodPatch, tt.path, "basin", "application/merge-patch+json", "Bearer sa-token-1",
				fmt.Sprintf(`{"spec":{"replicas":%d}}`, tt.replicas)}
			assert.Equal(t, []apiCall{get, patch, patch, get}, f.Calls())
		})
	}
}

func TestKubernetesRotatedToken(t *testing.T) {
	f := newFakeAPI(t, "sa-token-1")
	tokenFile := writeFile(t, "token", "sa-token-1")
	b := newKube(t, f, tokenFile)
	ctx := context.Background()
	require.NoError(t, b.Apply(ctx, Request{Role: RoleDecode, Replicas: 3}))

	// The kubelet rotates the projected token: the API server takes only the new one, and the
	// file holds it. The next call must send it, without a restart.
	f.set(func(f *fakeAPI) { f.token = "sa-token-2" })
	require.NoError(t, os.WriteFile(tokenFile, []byte("sa-token-2\n"), 0o600))
	require.NoError(t, b.Apply(ctx, Request{Role: RoleDecode, Replicas: 4}))
	assert.Equal(t, 4, f.spec("statefulsets/llm/sglang-decode"))

	calls := f.Calls()
	require.Len(t, calls, 2)
	assert.Equal(t, "Bearer sa-token-1", calls[0].Auth)
	assert.Equal(t, "Bearer sa-token-2", calls[1].Auth)

	// A token the API server no longer takes is an error that says so, without the token.
	f.set(func(f *fakeAPI) { f.token = "sa-token-3" })
	err := b.Apply(ctx, Request{Role: RoleDecode, Replicas: 5})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "kubernetes: scale StatefulSet llm/sglang-decode to 5: Unauthorized (401): Unauthorized "+
		"(the API server did not accept the token in kubernetes.token_file")
	assert.NotContains(t, err.Error(), "sa-token")
	var se *StatusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, StatusError{Code: 401, Reason: "Unauthorized", Message: "Unauthorized"}, *se)
	assert.Equal(t, 4, f.spec("statefulsets/llm/sglang-decode"))
}

func TestKubernetesConflictIsRetriedOnce(t *testing.T) {
	tests := []struct {
		conflicts int
		wantErr   string
		patches   int
		spec      int
	}{
		{1, "", 2, 3},
		{2, `Conflict (409): Operation cannot be fulfilled on statefulsets.apps "sglang-decode": the object has been modified; ` +
			`please apply your changes to the latest version and try again (the object changed under both PATCHes`, 2, 2},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d conflicts", tt.conflicts), func(t *testing.T) {
			f := newFakeAPI(t, "tok")
			f.conflicts = tt.conflicts
			b := newKube(t, f, writeFile(t, "token", "tok"))
			err := b.Apply(context.Background(), Request{Role: RoleDecode, Replicas: 3})
			if tt.wantErr == "" {
				assert.NoError(t, err)
			} else {
				assert.ErrorContains(t, err, tt.wantErr)
			}
			assert.Len(t, f.Calls(), tt.patches)
			assert.Equal(t, tt.spec, f.spec("statefulsets/llm/sglang-decode"))
		})
	}
}

func TestKubernetesErrors(t *testing.T) {
	tests := []struct {
		name   string
		script func(f *fakeAPI)
		cfg    func(c *KubernetesConfig)
		want   []string
		calls  int
	}{
		{"forbidden by RBAC", func(f *fakeAPI) { f.forbidden = true }, nil, []string{
			`kubernetes: scale Deployment llm/sglang-prefill to 4: Forbidden (403): deployments.apps "sglang-prefill" is forbidden: ` +
				`User "system:serviceaccount:llm:basin" cannot patch resource "deployments/scale" in API group "apps" in the namespace "llm"`,
			"(the service account needs the RBAC verbs get and patch on deployments/scale in the apps group, namespace llm)"}, 1},
		{"no such object", nil, func(c *KubernetesConfig) { c.Targets[RolePrefill] = ScaleTarget{Kind: "Deployment", Name: "sglang-p"} },
			[]string{`NotFound (404): deployments.apps "sglang-p" not found (no Deployment sglang-p in namespace llm: check kubernetes.targets`}, 1},
		{"wrong kind of object", nil, func(c *KubernetesConfig) {
			c.Targets[RolePrefill] = ScaleTarget{Kind: "StatefulSet", Name: "sglang-prefill"}
		},
			[]string{`NotFound (404): statefulsets.apps "sglang-prefill" not found (no StatefulSet sglang-prefill`}, 1},
		{"a proxy's error page", func(f *fakeAPI) {
			f.raw = &rawAnswer{http.StatusBadGateway, "<html>\n<body>upstream down</body></html>"}
		}, nil,
			[]string{"scale Deployment llm/sglang-prefill to 4: 502 Bad Gateway: <html> <body>upstream down</body></html>"}, 1},
		{"a redirect is not followed", func(f *fakeAPI) { f.raw = &rawAnswer{http.StatusTemporaryRedirect, ""} }, nil,
			[]string{"to 4: 307 Temporary Redirect"}, 1},
		{"not an API server", func(f *fakeAPI) { f.raw = &rawAnswer{http.StatusOK, `{"kind":"Deployment"}`} }, nil,
			[]string{`200 OK: answer is a "Deployment", not a Scale (is kubernetes.api_server the API server?)`}, 1},
		{"not JSON", func(f *fakeAPI) { f.raw = &rawAnswer{http.StatusOK, "<html>welcome</html>"} }, nil,
			[]string{"200 OK: answer is not a Scale: invalid character '<'", ": <html>welcome</html>"}, 1},
		{"a webhook changed the count", func(f *fakeAPI) { f.mutate = 2 }, nil,
			[]string{"scale Deployment llm/sglang-prefill to 4: the API server answered spec.replicas 2"}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeAPI(t, "s3cret-token")
			if tt.script != nil {
				tt.script(f)
			}
			cfg := kubeConfig(t, f, writeFile(t, "token", "s3cret-token"))
			if tt.cfg != nil {
				tt.cfg(&cfg.Kubernetes)
			}
			b, err := NewBackend(cfg, Wiring{})
			require.NoError(t, err)
			err = b.Apply(context.Background(), Request{Role: RolePrefill, Replicas: 4})
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.NotContains(t, err.Error(), "s3cret")
			assert.Len(t, f.Calls(), tt.calls)
		})
	}
}

func TestKubernetesCurrentErrors(t *testing.T) {
	f := newFakeAPI(t, "tok")
	f.forbidden = true
	b := newKube(t, f, writeFile(t, "token", "tok"))
	c, ok, err := b.Current(context.Background(), RoleDecode)
	require.Error(t, err)
	assert.False(t, ok)
	assert.Zero(t, c)
	assert.Contains(t, err.Error(), "kubernetes: read the scale of StatefulSet llm/sglang-decode: Forbidden (403): ")
	assert.Contains(t, err.Error(), `cannot get resource "statefulsets/scale"`)
	assert.Contains(t, err.Error(), "get and patch on statefulsets/scale")

	_, _, err = b.Current(context.Background(), "router")
	assert.ErrorContains(t, err, `kubernetes: role "router", want prefill or decode`)
	assert.Len(t, f.Calls(), 1, "an unknown role is not asked for")
}

func TestKubernetesRoleWithoutTarget(t *testing.T) {
	f := newFakeAPI(t, "tok")
	cfg := kubeConfig(t, f, writeFile(t, "token", "tok"))
	delete(cfg.Kubernetes.Targets, RolePrefill)
	b, err := NewBackend(cfg, Wiring{})
	require.NoError(t, err)

	c, ok, err := b.Current(context.Background(), RolePrefill)
	assert.NoError(t, err)
	assert.False(t, ok, "this backend does not scale prefill")
	assert.Zero(t, c)
	assert.ErrorContains(t, b.Apply(context.Background(), Request{Role: RolePrefill, Replicas: 2}),
		"kubernetes: no target for role prefill (kubernetes.targets.prefill)")
	assert.ErrorContains(t, b.Apply(context.Background(), Request{Role: RoleDecode, Replicas: -1}),
		"kubernetes: scale request: replicas: -1, must not be negative")
	assert.Empty(t, f.Calls())
}

func TestKubernetesTrustsOnlyTheCA(t *testing.T) {
	f := newFakeAPI(t, "tok")
	cfg := kubeConfig(t, f, writeFile(t, "token", "tok"))
	cfg.Kubernetes.CAFile = someCA(t) // another server's certificate
	b, err := NewBackend(cfg, Wiring{})
	require.NoError(t, err)
	err = b.Apply(context.Background(), Request{Role: RoleDecode, Replicas: 3})
	assert.ErrorContains(t, err, "certificate signed by unknown authority")
	assert.Empty(t, f.Calls(), "the token is not sent to a server the CA did not sign")
}

func TestKubernetesTimeout(t *testing.T) {
	f := newFakeAPI(t, "tok")
	release := make(chan struct{})
	f.hang = release
	t.Cleanup(func() { close(release) })
	cfg := kubeConfig(t, f, writeFile(t, "token", "tok"))
	cfg.Timeout = 100 * time.Millisecond
	b, err := NewBackend(cfg, Wiring{})
	require.NoError(t, err)

	start := time.Now()
	err = b.Apply(context.Background(), Request{Role: RoleDecode, Replicas: 3})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	_, _, err = b.Current(context.Background(), RoleDecode)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second, "a hung API server holds each call only for the timeout")
}

func TestKubernetesTokenFileGone(t *testing.T) {
	f := newFakeAPI(t, "tok")
	tokenFile := writeFile(t, "token", "tok")
	b := newKube(t, f, tokenFile)
	require.NoError(t, os.Remove(tokenFile))
	err := b.Apply(context.Background(), Request{Role: RoleDecode, Replicas: 3})
	assert.ErrorContains(t, err, "kubernetes: scale StatefulSet llm/sglang-decode to 3: bearer token: open ")
	assert.Empty(t, f.Calls(), "nothing is sent without a token")
}

func TestKubernetesInClusterEnvironment(t *testing.T) {
	f := newFakeAPI(t, "tok")
	cfg := kubeConfig(t, f, writeFile(t, "token", "tok"))
	cfg.Kubernetes.APIServer = ""
	host, port, ok := strings.Cut(strings.TrimPrefix(f.srv.URL, "https://"), ":")
	require.True(t, ok)
	env := map[string]string{"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
	b, err := NewBackend(cfg, Wiring{Getenv: func(k string) string { return env[k] }})
	require.NoError(t, err)
	require.NoError(t, b.Apply(context.Background(), Request{Role: RoleDecode, Replicas: 5}))
	assert.Equal(t, 5, f.spec("statefulsets/llm/sglang-decode"))
}

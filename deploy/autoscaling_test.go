package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/api/validate/content"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	k8sjson "sigs.k8s.io/json"
	k8syaml "sigs.k8s.io/yaml"
)

// The autoscaling examples: no mode applies them (an operator picks one of the two, or neither),
// so TestEveryManifestIsInAMode accepts exampleDirs and this file tests them.
const (
	kedaDir     = kubernetesDir + "/autoscaling/keda"
	hpaDir      = kubernetesDir + "/autoscaling/hpa"
	adapterFile = "prometheus-adapter/external-rules.yaml"

	// KEDA's ScaledObject CustomResourceDefinition and the patch its release applies to it,
	// vendored from KEDA's module (testdata/keda/README.md).
	kedaCRD      = "testdata/keda/keda.sh_scaledobjects.yaml"
	kedaCRDPatch = "testdata/keda/scaledobject_patch.yaml"
)

// exampleDirs are manifest directories that no mode applies; each has its own tests.
var exampleDirs = []string{kedaDir, hpaDir}

// roles are the values of basin_capacity_needed_instances' role label.
var roles = []string{"prefill", "decode"}

// prometheusTriggerKeys are the trigger metadata keys of KEDA's Prometheus scaler (KEDA v2.21's
// Prometheus scaler documentation and its metadata struct), prometheusTriggerRequired the ones it
// cannot do without. KEDA ignores a key outside the list, so a misspelt ignoreNullValue would
// silently leave the default, true, in force.
var (
	prometheusTriggerKeys = []string{
		"serverAddress", "query", "queryParameters", "threshold", "activationThreshold", "namespace",
		"customHeaders", "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout", "identityOwner", "authModes",
	}
	prometheusTriggerRequired = []string{"serverAddress", "query", "threshold"}
)

// kedaCEL is the one x-kubernetes-validations rule of the vendored CRD, which the API server
// evaluates with CEL and a JSON Schema validator does not: checkScaledObject evaluates it by hand,
// and loadKEDASchema refuses a CRD with any other rule until it is written out here too.
const kedaCEL = `!has(self.minReplicaCount) || self.minReplicaCount <= (has(self.maxReplicaCount) ? self.maxReplicaCount : 100)`

// The limits the API server's validation of autoscaling/v2 puts on behavior (Kubernetes'
// pkg/apis/autoscaling/validation: MaxStabilizationWindowSeconds, MaxPeriodSeconds).
const (
	maxStabilizationWindowSeconds = 3600
	maxPeriodSeconds              = 1800
)

// autoscalingChecks holds what the checks compare the examples with.
type autoscalingChecks struct {
	records    map[string]bool // the recording rules of rules/basin.rules.yml
	deployment string          // the daemon's deployment: in the Kubernetes manifests
	keda       *jsonschema.Schema
	adapter    adapterConfig // prometheus-adapter's rules, for the HPAs' External metrics
}

// scaled is what one example scales: its target and the PromQL the autoscaler sends for it.
type scaled struct {
	file, kind, name         string // the ScaledObject or HPA
	namespace                string
	targetKind, targetName   string
	role                     string
	query                    string
	minReplicas, maxReplicas int32
	scaleDownWindowSeconds   int32
}

func newAutoscalingChecks(t *testing.T) *autoscalingChecks {
	t.Helper()
	c := &autoscalingChecks{records: recordingRules(t)}
	cfg, _ := daemonConfig(t, loadManifests(t, single))
	c.deployment = cfg.Deployment
	require.NotEmpty(t, c.deployment)
	var err error
	c.keda, err = loadKEDASchema(kedaCRD, kedaCRDPatch)
	require.NoError(t, err)
	data, err := os.ReadFile(adapterFile)
	require.NoError(t, err)
	c.adapter, err = c.checkAdapter(data)
	require.NoError(t, err, adapterFile)
	return c
}

// recordingRules are the names the rules file records.
func recordingRules(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	var rf struct {
		Groups []struct {
			Rules []struct {
				Record string `yaml:"record"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(data, &rf))
	out := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				out[r.Record] = true
			}
		}
	}
	require.NotEmpty(t, out)
	return out
}

// --- KEDA: the ScaledObject schema of KEDA's own CRD.

// loadKEDASchema compiles the v1alpha1 openAPIV3Schema of KEDA's ScaledObject CRD, after the
// JSON patch KEDA's release applies to it, as the API server would apply it: an object schema
// that lists properties refuses any other field (kubectl's default field validation, Strict, makes
// the API server refuse unknown fields rather than prune them, unless a schema says
// x-kubernetes-preserve-unknown-fields). metadata is left open here, as in the CRD: the API server
// checks it itself, and so does checkObjectMeta.
func loadKEDASchema(crdFile, patchFile string) (*jsonschema.Schema, error) {
	crd, err := yamlFileToJSONValue(crdFile)
	if err != nil {
		return nil, err
	}
	patch, err := yamlFileToJSONValue(patchFile)
	if err != nil {
		return nil, err
	}
	if err := applyAddPatch(crd, patch); err != nil {
		return nil, fmt.Errorf("%s: %w", patchFile, err)
	}
	var schema any
	versions, _ := lookup(crd, "spec", "versions").([]any)
	for _, v := range versions {
		if lookup(v, "name") == "v1alpha1" {
			schema = lookup(v, "schema", "openAPIV3Schema")
		}
	}
	if schema == nil {
		return nil, fmt.Errorf("%s: no v1alpha1 openAPIV3Schema", crdFile)
	}
	var cel []string
	closeObjects(schema, "", &cel)
	if want := []string{"/spec: " + kedaCEL}; !slices.Equal(cel, want) {
		return nil, fmt.Errorf("%s: x-kubernetes-validations %q, want %q: evaluate the new rules in checkScaledObject", crdFile, cel, want)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft4) // OpenAPI 3.0's schema objects are a draft-4 dialect
	const loc = "urn:keda.sh:scaledobjects:v1alpha1"
	if err := c.AddResource(loc, schema); err != nil {
		return nil, err
	}
	return c.Compile(loc)
}

// closeObjects sets additionalProperties: false on every object schema that lists properties and
// neither allows others nor preserves unknown fields, and collects the x-kubernetes-validations
// rules with the path of the schema they are on.
func closeObjects(s any, at string, cel *[]string) {
	switch s := s.(type) {
	case map[string]any:
		if rules, ok := s["x-kubernetes-validations"].([]any); ok {
			for _, r := range rules {
				*cel = append(*cel, fmt.Sprintf("%s: %v", at, lookup(r, "rule")))
			}
		}
		_, hasProps := s["properties"]
		_, hasAdditional := s["additionalProperties"]
		if hasProps && !hasAdditional && s["x-kubernetes-preserve-unknown-fields"] != true {
			s["additionalProperties"] = false
		}
		if props, ok := s["properties"].(map[string]any); ok {
			for k, v := range props {
				closeObjects(v, at+"/"+k, cel)
			}
		}
		for _, k := range []string{"items", "additionalProperties"} {
			if v, ok := s[k].(map[string]any); ok {
				closeObjects(v, at+"/"+k, cel)
			}
		}
		for _, k := range []string{"anyOf", "allOf", "oneOf"} {
			if vs, ok := s[k].([]any); ok {
				for _, v := range vs {
					closeObjects(v, at, cel)
				}
			}
		}
	}
}

// applyAddPatch applies a JSON patch (RFC 6902) of "add" operations, the only kind KEDA's CRD patch
// has, to doc.
func applyAddPatch(doc, patch any) error {
	ops, ok := patch.([]any)
	if !ok {
		return errors.New("a JSON patch is a list of operations")
	}
	for i, op := range ops {
		if lookup(op, "op") != "add" {
			return fmt.Errorf("operation %d: op %v: only add is supported", i, lookup(op, "op"))
		}
		p, _ := lookup(op, "path").(string)
		tokens := strings.Split(strings.TrimPrefix(p, "/"), "/")
		if !strings.HasPrefix(p, "/") || len(tokens) == 0 {
			return fmt.Errorf("operation %d: path %q", i, p)
		}
		parent := doc
		for _, tok := range tokens[:len(tokens)-1] {
			tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
			switch c := parent.(type) {
			case map[string]any:
				parent = c[tok]
			case []any:
				n, err := strconv.Atoi(tok)
				if err != nil || n < 0 || n >= len(c) {
					return fmt.Errorf("operation %d: path %q: no element %q", i, p, tok)
				}
				parent = c[n]
			default:
				parent = nil
			}
			if parent == nil {
				return fmt.Errorf("operation %d: path %q: %q does not exist", i, p, tok)
			}
		}
		m, ok := parent.(map[string]any)
		if !ok {
			return fmt.Errorf("operation %d: path %q: the parent is not an object", i, p)
		}
		m[tokens[len(tokens)-1]] = lookup(op, "value")
	}
	return nil
}

// lookup walks a decoded JSON value by object keys; nil where a key is missing.
func lookup(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// checkKEDA checks every ScaledObject of a file.
func (c *autoscalingChecks) checkKEDA(file string, data []byte) ([]scaled, error) {
	return checkEach(file, data, c.checkScaledObject)
}

// checkEach checks every document of a file with check, then that the file scales each role once.
func checkEach(file string, data []byte, check func([]byte) (scaled, error)) ([]scaled, error) {
	docs, err := splitDocs(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var out []scaled
	var errs []error
	for i, d := range docs {
		s, err := check(d)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s document %d: %w", file, i, err))
			continue
		}
		s.file = file
		out = append(out, s)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, checkRoles(file, out)
}

// scaledObject is the part of a ScaledObject the semantic checks read, after the schema has
// refused anything else.
type scaledObject struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount *int32 `json:"minReplicaCount"`
		MaxReplicaCount *int32 `json:"maxReplicaCount"`
		Advanced        *struct {
			HorizontalPodAutoscalerConfig *struct {
				Behavior json.RawMessage `json:"behavior"`
			} `json:"horizontalPodAutoscalerConfig"`
		} `json:"advanced"`
		Triggers []struct {
			Type       string            `json:"type"`
			MetricType string            `json:"metricType"`
			Metadata   map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

func (c *autoscalingChecks) checkScaledObject(doc []byte) (scaled, error) {
	js, err := k8syaml.YAMLToJSONStrict(doc)
	if err != nil {
		return scaled{}, err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		return scaled{}, err
	}
	if err := c.keda.Validate(inst); err != nil {
		return scaled{}, fmt.Errorf("KEDA's ScaledObject schema: %w", err)
	}
	var so scaledObject // the schema has refused unknown fields; this reads the ones checked below
	if err := k8sjson.UnmarshalCaseSensitivePreserveInts(js, &so); err != nil {
		return scaled{}, err
	}
	if so.APIVersion != "keda.sh/v1alpha1" || so.Kind != "ScaledObject" {
		return scaled{}, fmt.Errorf("%s %s: want keda.sh/v1alpha1 ScaledObject", so.APIVersion, so.Kind)
	}
	if err := checkObjectMeta(js); err != nil {
		return scaled{}, err
	}
	spec := &so.Spec
	// The CRD's CEL rule (kedaCEL).
	if spec.MinReplicaCount != nil {
		maxCount := int32(100)
		if spec.MaxReplicaCount != nil {
			maxCount = *spec.MaxReplicaCount
		}
		if *spec.MinReplicaCount > maxCount {
			return scaled{}, errors.New("spec: minReplicaCount must be less than or equal to maxReplicaCount (the CRD's x-kubernetes-validations)")
		}
	}
	s := scaled{kind: so.Kind, name: so.Metadata.Name, namespace: so.Metadata.Namespace,
		targetKind: spec.ScaleTargetRef.Kind, targetName: spec.ScaleTargetRef.Name}
	if spec.ScaleTargetRef.Kind == "" || spec.ScaleTargetRef.APIVersion == "" {
		// KEDA defaults both to apps/v1 Deployment; saying it keeps the two examples comparable.
		return s, errors.New("spec.scaleTargetRef: say apiVersion and kind")
	}
	var behavior *autoscalingv2.HorizontalPodAutoscalerBehavior
	if a := spec.Advanced; a != nil && a.HorizontalPodAutoscalerConfig != nil && a.HorizontalPodAutoscalerConfig.Behavior != nil {
		// KEDA copies behavior into the HPA it creates, where the API server validates it: a
		// value it refuses fails KEDA's reconcile, after `kubectl apply` has succeeded.
		behavior = &autoscalingv2.HorizontalPodAutoscalerBehavior{}
		if err := strictJSON(a.HorizontalPodAutoscalerConfig.Behavior, behavior); err != nil {
			return s, fmt.Errorf("spec.advanced.horizontalPodAutoscalerConfig.behavior: %w", err)
		}
	}
	if err := checkReplicas(&s, "spec.minReplicaCount", spec.MinReplicaCount, "spec.maxReplicaCount", spec.MaxReplicaCount,
		"spec.advanced.horizontalPodAutoscalerConfig.behavior", behavior); err != nil {
		return s, err
	}
	if len(spec.Triggers) != 1 {
		return s, fmt.Errorf("spec.triggers: %d, want one (the Prometheus trigger)", len(spec.Triggers))
	}
	tr := spec.Triggers[0]
	if tr.Type != "prometheus" {
		return s, fmt.Errorf("spec.triggers[0].type %q, want prometheus", tr.Type)
	}
	if tr.MetricType != string(autoscalingv2.AverageValueMetricType) {
		return s, fmt.Errorf("spec.triggers[0].metricType %q, want AverageValue: with Value the HPA keeps the value per replica constant, not the replicas equal to it", tr.MetricType)
	}
	for k := range tr.Metadata {
		if !slices.Contains(prometheusTriggerKeys, k) {
			return s, fmt.Errorf("spec.triggers[0].metadata.%s: not a key of KEDA's Prometheus scaler (it would be ignored)", k)
		}
	}
	for _, k := range prometheusTriggerRequired {
		if tr.Metadata[k] == "" {
			return s, fmt.Errorf("spec.triggers[0].metadata.%s: required", k)
		}
	}
	if th, err := strconv.ParseFloat(tr.Metadata["threshold"], 64); err != nil || th != 1 {
		return s, fmt.Errorf("spec.triggers[0].metadata.threshold %q, want \"1\": one replica per needed instance", tr.Metadata["threshold"])
	}
	if tr.Metadata["ignoreNullValues"] != "false" {
		return s, fmt.Errorf("spec.triggers[0].metadata.ignoreNullValues %q, want \"false\": KEDA would read no series as 0 and scale to minReplicaCount", tr.Metadata["ignoreNullValues"])
	}
	if u, err := url.Parse(tr.Metadata["serverAddress"]); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return s, fmt.Errorf("spec.triggers[0].metadata.serverAddress %q: want http(s)://host:port", tr.Metadata["serverAddress"])
	}
	s.query = tr.Metadata["query"]
	s.role, err = c.checkQuery(s.query)
	if err != nil {
		return s, fmt.Errorf("spec.triggers[0].metadata.query: %w", err)
	}
	return s, nil
}

// --- HPA: autoscaling/v2 as the API server decodes and validates it.

// checkHPA checks every HorizontalPodAutoscaler of a file.
func (c *autoscalingChecks) checkHPA(file string, data []byte) ([]scaled, error) {
	return checkEach(file, data, c.checkHorizontalPodAutoscaler)
}

func (c *autoscalingChecks) checkHorizontalPodAutoscaler(doc []byte) (scaled, error) {
	js, err := k8syaml.YAMLToJSONStrict(doc)
	if err != nil {
		return scaled{}, err
	}
	var hpa autoscalingv2.HorizontalPodAutoscaler
	if err := strictJSON(js, &hpa); err != nil {
		return scaled{}, err
	}
	if hpa.APIVersion != "autoscaling/v2" || hpa.Kind != "HorizontalPodAutoscaler" {
		return scaled{}, fmt.Errorf("%s %s: want autoscaling/v2 HorizontalPodAutoscaler", hpa.APIVersion, hpa.Kind)
	}
	if err := checkObjectMeta(js); err != nil {
		return scaled{}, err
	}
	spec := &hpa.Spec
	s := scaled{kind: hpa.Kind, name: hpa.Name, namespace: hpa.Namespace,
		targetKind: spec.ScaleTargetRef.Kind, targetName: spec.ScaleTargetRef.Name}
	// The API server's validation of the fields these manifests use.
	var errs field.ErrorList
	ref := field.NewPath("spec", "scaleTargetRef")
	if spec.ScaleTargetRef.Kind == "" {
		errs = append(errs, field.Required(ref.Child("kind"), ""))
	}
	if spec.ScaleTargetRef.Name == "" {
		errs = append(errs, field.Required(ref.Child("name"), ""))
	}
	for _, msg := range content.IsPathSegmentName(spec.ScaleTargetRef.Name) {
		errs = append(errs, field.Invalid(ref.Child("name"), spec.ScaleTargetRef.Name, msg))
	}
	if spec.MaxReplicas < 1 {
		errs = append(errs, field.Invalid(field.NewPath("spec", "maxReplicas"), spec.MaxReplicas, "must be greater than or equal to 1"))
	}
	if len(errs) > 0 {
		return s, errs.ToAggregate()
	}
	maxReplicas := spec.MaxReplicas
	if err := checkReplicas(&s, "spec.minReplicas", spec.MinReplicas, "spec.maxReplicas", &maxReplicas, "spec.behavior", spec.Behavior); err != nil {
		return s, err
	}
	if len(spec.Metrics) != 1 {
		return s, fmt.Errorf("spec.metrics: %d, want one (basin's External metric)", len(spec.Metrics))
	}
	m := spec.Metrics[0]
	if m.Type != autoscalingv2.ExternalMetricSourceType || m.External == nil {
		return s, fmt.Errorf("spec.metrics[0].type %q, want External with external set", m.Type)
	}
	if m.Resource != nil || m.Pods != nil || m.Object != nil || m.ContainerResource != nil {
		return s, errors.New("spec.metrics[0]: must populate the given metric source only")
	}
	ext := m.External
	tgt := field.NewPath("spec", "metrics").Index(0).Child("external", "target")
	if ext.Target.Type != autoscalingv2.AverageValueMetricType {
		return s, field.Invalid(tgt.Child("type"), ext.Target.Type, "want AverageValue: with Value the HPA keeps the value per replica constant, not the replicas equal to it")
	}
	if ext.Target.Value != nil || ext.Target.AverageUtilization != nil {
		return s, field.Forbidden(tgt, "only averageValue")
	}
	if ext.Target.AverageValue == nil || ext.Target.AverageValue.Sign() != 1 {
		return s, field.Invalid(tgt.Child("averageValue"), ext.Target.AverageValue, "must be positive")
	}
	if ext.Target.AverageValue.Cmp(resource.MustParse("1")) != 0 {
		return s, field.Invalid(tgt.Child("averageValue"), ext.Target.AverageValue.String(), "want 1: one replica per needed instance")
	}
	metric := field.NewPath("spec", "metrics").Index(0).Child("external", "metric")
	if ext.Metric.Name == "" {
		return s, field.Required(metric.Child("name"), "")
	}
	if msgs := content.IsPathSegmentName(ext.Metric.Name); len(msgs) > 0 {
		return s, field.Invalid(metric.Child("name"), ext.Metric.Name, strings.Join(msgs, "; "))
	}
	sel := ext.Metric.Selector
	if errs := metav1validation.ValidateLabelSelector(sel, metav1validation.LabelSelectorValidationOptions{}, metric.Child("selector")); len(errs) > 0 {
		return s, errs.ToAggregate()
	}
	if sel == nil || len(sel.MatchExpressions) > 0 {
		return s, field.Invalid(metric.Child("selector"), sel, "want matchLabels only (deployment and role)")
	}
	rule, ok := c.adapter.external(ext.Metric.Name)
	if !ok {
		return s, field.Invalid(metric.Child("name"), ext.Metric.Name, "no externalRules entry of "+adapterFile+" serves it (name.as)")
	}
	s.query, err = rule.render(sel.MatchLabels)
	if err != nil {
		return s, err
	}
	s.role, err = c.checkQuery(s.query)
	if err != nil {
		return s, fmt.Errorf("%s (the query prometheus-adapter sends for it): %w", metric, err)
	}
	return s, nil
}

// --- The checks both examples share.

// checkObjectMeta runs the API server's own metadata validation on a manifest's metadata:
// a DNS-subdomain name and a namespace, decoded strictly.
func checkObjectMeta(js []byte) error {
	var obj struct {
		Metadata json.RawMessage `json:"metadata"`
	}
	if err := json.Unmarshal(js, &obj); err != nil {
		return err
	}
	var meta metav1.ObjectMeta
	if err := strictJSON(obj.Metadata, &meta); err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	if errs := apivalidation.ValidateObjectMeta(&meta, true, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata")); len(errs) > 0 {
		return errs.ToAggregate()
	}
	return nil
}

// checkReplicas checks the bounds and the scaling behaviour of either example, and records them.
func checkReplicas(s *scaled, minField string, minReplicas *int32, maxField string, maxReplicas *int32,
	behaviorField string, b *autoscalingv2.HorizontalPodAutoscalerBehavior) error {
	switch {
	case minReplicas == nil:
		return fmt.Errorf("%s: say it (never 0)", minField)
	case *minReplicas < 1:
		return fmt.Errorf("%s %d: a pool at zero instances serves nothing, and the need is counted from traffic", minField, *minReplicas)
	case maxReplicas == nil:
		return fmt.Errorf("%s: say it (your GPUs)", maxField)
	case *maxReplicas < *minReplicas:
		return fmt.Errorf("%s %d < %s %d", maxField, *maxReplicas, minField, *minReplicas)
	}
	s.minReplicas, s.maxReplicas = *minReplicas, *maxReplicas
	if b == nil || b.ScaleDown == nil || b.ScaleDown.StabilizationWindowSeconds == nil {
		return fmt.Errorf("%s.scaleDown.stabilizationWindowSeconds: say it", behaviorField)
	}
	if errs := validateBehavior(b, behaviorField); len(errs) > 0 {
		return errs.ToAggregate()
	}
	if p := b.ScaleDown.SelectPolicy; p != nil && *p == autoscalingv2.DisabledPolicySelect {
		return fmt.Errorf("%s.scaleDown.selectPolicy Disabled: the pool would never shrink", behaviorField)
	}
	s.scaleDownWindowSeconds = *b.ScaleDown.StabilizationWindowSeconds
	return nil
}

// validateBehavior is the API server's validation of an HPA's behavior (Kubernetes'
// pkg/apis/autoscaling/validation), written out: a window within [0, 3600] s, a known
// selectPolicy, at least one policy, each of a known type with a positive value and a period
// within (0, 1800] s, and a tolerance that is not negative.
func validateBehavior(b *autoscalingv2.HorizontalPodAutoscalerBehavior, at string) field.ErrorList {
	var errs field.ErrorList
	for dir, r := range map[string]*autoscalingv2.HPAScalingRules{"scaleUp": b.ScaleUp, "scaleDown": b.ScaleDown} {
		if r == nil {
			continue
		}
		p := field.NewPath(at, dir)
		if w := r.StabilizationWindowSeconds; w != nil && (*w < 0 || *w > maxStabilizationWindowSeconds) {
			errs = append(errs, field.Invalid(p.Child("stabilizationWindowSeconds"), *w, fmt.Sprintf("must be within [0, %d]", maxStabilizationWindowSeconds)))
		}
		if sp := r.SelectPolicy; sp != nil && !slices.Contains([]autoscalingv2.ScalingPolicySelect{
			autoscalingv2.MaxChangePolicySelect, autoscalingv2.MinChangePolicySelect, autoscalingv2.DisabledPolicySelect}, *sp) {
			errs = append(errs, field.NotSupported(p.Child("selectPolicy"), *sp, []string{"Max", "Min", "Disabled"}))
		}
		if len(r.Policies) == 0 {
			errs = append(errs, field.Required(p.Child("policies"), "must specify at least one Policy"))
		}
		for i, pol := range r.Policies {
			pp := p.Child("policies").Index(i)
			if pol.Type != autoscalingv2.PodsScalingPolicy && pol.Type != autoscalingv2.PercentScalingPolicy {
				errs = append(errs, field.NotSupported(pp.Child("type"), pol.Type, []string{"Pods", "Percent"}))
			}
			if pol.Value <= 0 {
				errs = append(errs, field.Invalid(pp.Child("value"), pol.Value, "must be greater than zero"))
			}
			if pol.PeriodSeconds <= 0 || pol.PeriodSeconds > maxPeriodSeconds {
				errs = append(errs, field.Invalid(pp.Child("periodSeconds"), pol.PeriodSeconds, fmt.Sprintf("must be within (0, %d]", maxPeriodSeconds)))
			}
		}
		if r.Tolerance != nil && r.Tolerance.Sign() < 0 {
			errs = append(errs, field.Invalid(p.Child("tolerance"), r.Tolerance.String(), "must be greater than or equal to zero"))
		}
	}
	return errs
}

// checkQuery parses the PromQL an autoscaler sends and checks that it names only series basin's
// rules record, each selected by the daemon's deployment and one role; it returns the role.
func (c *autoscalingChecks) checkQuery(q string) (string, error) {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(q)
	if err != nil {
		return "", err
	}
	var sels []*parser.VectorSelector
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			sels = append(sels, vs)
		}
		return nil
	})
	if len(sels) != 1 {
		return "", fmt.Errorf("%q selects %d series names, want one", q, len(sels))
	}
	eq := map[string]string{}
	for _, m := range sels[0].LabelMatchers {
		if m.Type != labels.MatchEqual {
			return "", fmt.Errorf("%q: matcher %s: want = only", q, m)
		}
		eq[m.Name] = m.Value
	}
	name := eq[model.MetricNameLabel]
	if !c.records[name] {
		return "", fmt.Errorf("%q names %q, which no recording rule of %s records", q, name, rulesFile)
	}
	if eq["deployment"] != c.deployment {
		return "", fmt.Errorf("%q: deployment %q, want the daemon's deployment: %q", q, eq["deployment"], c.deployment)
	}
	if !slices.Contains(roles, eq["role"]) {
		return "", fmt.Errorf("%q: role %q, want one of %q", q, eq["role"], roles)
	}
	return eq["role"], nil
}

// checkRoles: one file scales each role once, each on its own target.
func checkRoles(file string, ss []scaled) error {
	got := map[string]int{}
	targets := map[string]bool{}
	for _, s := range ss {
		got[s.role]++
		t := s.namespace + "/" + s.targetKind + "/" + s.targetName
		if targets[t] {
			return fmt.Errorf("%s: %s is scaled twice", file, t)
		}
		targets[t] = true
	}
	for _, r := range roles {
		if got[r] != 1 {
			return fmt.Errorf("%s: role %s scaled %d times, want once", file, r, got[r])
		}
	}
	return nil
}

// --- prometheus-adapter's configuration, decoded strictly as the adapter does (its
// pkg/config.MetricsDiscoveryConfig, read with yaml.UnmarshalStrict).

type adapterConfig struct {
	Rules         []adapterRule `yaml:"rules"`
	ResourceRules any           `yaml:"resourceRules"`
	ExternalRules []adapterRule `yaml:"externalRules"`
}

type adapterRule struct {
	SeriesQuery   string `yaml:"seriesQuery"`
	SeriesFilters []struct {
		Is    string `yaml:"is"`
		IsNot string `yaml:"isNot"`
	} `yaml:"seriesFilters"`
	Resources struct {
		Template  string `yaml:"template"`
		Overrides map[string]struct {
			Group    string `yaml:"group"`
			Resource string `yaml:"resource"`
		} `yaml:"overrides"`
		Namespaced *bool `yaml:"namespaced"`
	} `yaml:"resources"`
	Name struct {
		Matches string `yaml:"matches"`
		As      string `yaml:"as"`
	} `yaml:"name"`
	MetricsQuery           string `yaml:"metricsQuery"`
	LabelValueReplacements []struct {
		Find    string `yaml:"find"`
		Replace string `yaml:"replace"`
	} `yaml:"labelValueReplacements"`

	series string // the recording rule seriesQuery selects
}

func (a adapterConfig) external(name string) (adapterRule, bool) {
	for _, r := range a.ExternalRules {
		if r.Name.As == name {
			return r, true
		}
	}
	return adapterRule{}, false
}

// render is the query the adapter sends for an HPA's selector: metricsQuery with .Series the
// series name and .LabelMatchers the selector's labels as name="value", sorted by name,
// comma-separated (what its query builder writes for matchLabels; with namespaced: false it adds
// no namespace).
func (r adapterRule) render(matchLabels map[string]string) (string, error) {
	tmpl, err := template.New("metricsQuery").Delims("<<", ">>").Parse(r.MetricsQuery)
	if err != nil {
		return "", fmt.Errorf("metricsQuery: %w", err)
	}
	var ms []string
	for _, k := range slices.Sorted(maps.Keys(matchLabels)) {
		ms = append(ms, fmt.Sprintf("%s=%q", k, matchLabels[k]))
	}
	var b strings.Builder
	err = tmpl.Execute(&b, map[string]any{
		"Series": r.series, "LabelMatchers": strings.Join(ms, ","), "LabelValuesByName": matchLabels,
		"GroupBy": "", "GroupBySlice": []string{},
	})
	if err != nil {
		return "", fmt.Errorf("metricsQuery: %w", err)
	}
	return b.String(), nil
}

func (c *autoscalingChecks) checkAdapter(data []byte) (adapterConfig, error) {
	var cfg adapterConfig
	if err := strictDecode(data, &cfg); err != nil {
		return cfg, err
	}
	if len(cfg.ExternalRules) == 0 {
		return cfg, errors.New("externalRules: none")
	}
	for i := range cfg.ExternalRules {
		r := &cfg.ExternalRules[i]
		at := fmt.Sprintf("externalRules[%d]", i)
		ms, err := parser.NewParser(parser.Options{}).ParseMetricSelector(r.SeriesQuery)
		if err != nil {
			return cfg, fmt.Errorf("%s.seriesQuery: %w", at, err)
		}
		for _, m := range ms {
			if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
				r.series = m.Value
			}
		}
		if !c.records[r.series] {
			return cfg, fmt.Errorf("%s.seriesQuery %q: %q is no recording rule of %s", at, r.SeriesQuery, r.series, rulesFile)
		}
		re, err := regexp.Compile(r.Name.Matches)
		if err != nil {
			return cfg, fmt.Errorf("%s.name.matches: %w", at, err)
		}
		if !re.MatchString(r.series) {
			return cfg, fmt.Errorf("%s.name.matches %q does not match %q", at, r.Name.Matches, r.series)
		}
		if r.Name.As == "" || len(content.IsPathSegmentName(r.Name.As)) > 0 || strings.Contains(r.Name.As, ":") {
			return cfg, fmt.Errorf("%s.name.as %q: want a metric name without colons (the HPA's external metric name)", at, r.Name.As)
		}
		if r.Resources.Namespaced == nil || *r.Resources.Namespaced {
			return cfg, fmt.Errorf("%s.resources.namespaced: want false: the series has no namespace label, and the adapter would add the HPA's", at)
		}
		q, err := r.render(map[string]string{"deployment": c.deployment, "role": roles[0]})
		if err != nil {
			return cfg, fmt.Errorf("%s: %w", at, err)
		}
		if _, err := c.checkQuery(q); err != nil {
			return cfg, fmt.Errorf("%s.metricsQuery: %w", at, err)
		}
	}
	return cfg, nil
}

// --- Decoding.

// strictJSON decodes as the API server does with kubectl's default field validation (Strict):
// field names case-sensitive, unknown and duplicate fields refused.
func strictJSON(data []byte, v any) error {
	strict, err := k8sjson.UnmarshalStrict(data, v)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// splitDocs splits a YAML stream into its non-empty documents.
func splitDocs(data []byte) ([][]byte, error) {
	var out [][]byte
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(n.Content) == 0 || n.Content[0].Tag == "!!null" {
			continue
		}
		b, err := yaml.Marshal(&n)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
}

// yamlFileToJSONValue reads a YAML file as the JSON value jsonschema validates.
func yamlFileToJSONValue(file string) (any, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	js, err := k8syaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return jsonschema.UnmarshalJSON(bytes.NewReader(js))
}

// --- Tests.

func readExample(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	require.Len(t, files, 1, "one file in %s", dir)
	data, err := os.ReadFile(files[0])
	require.NoError(t, err)
	return files[0], data
}

// TestAutoscalingExamples checks the KEDA and HPA examples against their schemas and basin's
// rules, and that they scale the same targets alike.
func TestAutoscalingExamples(t *testing.T) {
	c := newAutoscalingChecks(t)
	kf, kd := readExample(t, kedaDir)
	keda, err := c.checkKEDA(kf, kd)
	require.NoError(t, err)
	hf, hd := readExample(t, hpaDir)
	hpa, err := c.checkHPA(hf, hd)
	require.NoError(t, err)

	byRole := func(ss []scaled) map[string]scaled {
		out := map[string]scaled{}
		for _, s := range ss {
			out[s.role] = s
		}
		return out
	}
	k, h := byRole(keda), byRole(hpa)
	for _, r := range roles {
		t.Run(r, func(t *testing.T) {
			// The two examples are alternatives: the same targets, bounds and scale-down window.
			assert.Equal(t, k[r].namespace, h[r].namespace, "namespace")
			assert.Equal(t, k[r].targetKind+"/"+k[r].targetName, h[r].targetKind+"/"+h[r].targetName, "scale target")
			assert.Equal(t, k[r].minReplicas, h[r].minReplicas, "min replicas")
			assert.Equal(t, k[r].maxReplicas, h[r].maxReplicas, "max replicas")
			assert.Equal(t, k[r].scaleDownWindowSeconds, h[r].scaleDownWindowSeconds, "scale-down window")
			assert.Contains(t, k[r].targetName, r, "the %s pool's target", r)
		})
	}
}

// TestAutoscalingQueriesOnPrometheus runs the query each example sends (KEDA's as written, the
// HPA's as prometheus-adapter renders it) through promtool, on basin's rules and a replicated
// daemon pair's basin_capacity_needed_instances for two deployments: each returns exactly one
// series, the role's needed instances for the daemon's deployment.
func TestAutoscalingQueriesOnPrometheus(t *testing.T) {
	bin, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("promtool is not on PATH (%v), and CI is set: CI must install it (Debian package prometheus)", err)
		}
		t.Skipf("promtool is not on PATH (%v): install Prometheus' promtool (Debian: apt-get install prometheus) to run this", err)
	}
	c := newAutoscalingChecks(t)
	kf, kd := readExample(t, kedaDir)
	keda, err := c.checkKEDA(kf, kd)
	require.NoError(t, err)
	hf, hd := readExample(t, hpaDir)
	hpa, err := c.checkHPA(hf, hd)
	require.NoError(t, err)

	// The acting daemon and the standby differ for the prefill role; the larger wins.
	needed := map[string]int{"prefill": 3, "decode": 2}
	var series []map[string]string
	for _, d := range []struct {
		deployment string
		instance   string
		prefill    int
		decode     int
	}{
		{c.deployment, "b0:9095", 3, 2},
		{c.deployment, "b1:9095", 2, 2},
		{"other", "o0:9095", 7, 5},
	} {
		for role, v := range map[string]int{"prefill": d.prefill, "decode": d.decode} {
			series = append(series, map[string]string{
				"series": fmt.Sprintf(`basin_capacity_needed_instances{deployment=%q,role=%q,job="basin-daemon",instance=%q}`, d.deployment, role, d.instance),
				"values": fmt.Sprintf("%dx20", v),
			})
		}
	}
	var exprs []map[string]any
	for _, s := range append(keda, hpa...) {
		exprs = append(exprs,
			map[string]any{"expr": "count(" + s.query + ")", "eval_time": "15m",
				"exp_samples": []map[string]any{{"labels": "{}", "value": 1}}},
			map[string]any{"expr": "sum(" + s.query + ")", "eval_time": "15m",
				"exp_samples": []map[string]any{{"labels": "{}", "value": needed[s.role]}}})
	}
	rules, err := filepath.Abs(rulesFile)
	require.NoError(t, err)
	test, err := yaml.Marshal(map[string]any{
		"rule_files":          []string{rules},
		"evaluation_interval": "1m",
		"tests": []map[string]any{{
			"interval":         "1m",
			"input_series":     series,
			"promql_expr_test": exprs,
		}},
	})
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "autoscaling_test.yml")
	require.NoError(t, os.WriteFile(file, test, 0o644))
	out, err := exec.CommandContext(t.Context(), bin, "test", "rules", file).CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s\n%s", out, test)
	assert.Len(t, exprs, 2*(len(keda)+len(hpa)))
}

// TestAutoscalingChecksCatchBreakage: each check refuses a broken copy of the real file, for the
// reason it names. Every case edits the example as it is (the edit must apply).
func TestAutoscalingChecksCatchBreakage(t *testing.T) {
	c := newAutoscalingChecks(t)
	_, kedaData := readExample(t, kedaDir)
	_, hpaData := readExample(t, hpaDir)
	adapterData, err := os.ReadFile(adapterFile)
	require.NoError(t, err)

	keda := func(data []byte) error { _, err := c.checkKEDA("keda", data); return err }
	hpa := func(data []byte) error { _, err := c.checkHPA("hpa", data); return err }
	adapter := func(data []byte) error { _, err := c.checkAdapter(data); return err }
	for _, tc := range []struct {
		name     string
		data     []byte
		check    func([]byte) error
		old, new string
		want     string
	}{
		// KEDA, by its CRD's schema.
		{"keda misspelt field", kedaData, keda, "minReplicaCount: 1\n", "minReplicaCont: 1\n", "minReplicaCont"},
		{"keda threshold a number", kedaData, keda, `threshold: "1"`, `threshold: 1`, "threshold"},
		{"keda pollingInterval a string", kedaData, keda, "pollingInterval: 30", `pollingInterval: "30"`, "pollingInterval"},
		{"keda window over the patch's maximum", kedaData, keda, "stabilizationWindowSeconds: 300", "stabilizationWindowSeconds: 7200", "stabilizationWindowSeconds"},
		{"keda no triggers", kedaData, keda, "  triggers:\n    - type: prometheus", "  triggerz:\n    - type: prometheus", "triggerz"},
		{"keda unknown fallback behavior", kedaData, keda, "  pollingInterval: 30\n", "  pollingInterval: 30\n  fallback: {failureThreshold: 3, replicas: 1, behavior: sometimes}\n", "behavior"},
		// KEDA, by the CRD's CEL rule and the HPA KEDA creates.
		{"keda maxReplicaCount under the schema's minimum", kedaData, keda, "maxReplicaCount: 8", "maxReplicaCount: 0", "maxReplicaCount"},
		{"keda min over max (CEL)", kedaData, keda, "minReplicaCount: 1\n", "minReplicaCount: 9\n", "minReplicaCount must be less than or equal to maxReplicaCount"},
		{"keda policy period over 1800 s", kedaData, keda, "periodSeconds: 300", "periodSeconds: 3600", "periodSeconds"},
		{"keda policy type", kedaData, keda, "- type: Pods", "- type: Replicas", "Replicas"},
		// KEDA, by what basin needs of it.
		{"keda metadata key misspelt", kedaData, keda, `ignoreNullValues: "false"`, `ignoreNullValue: "false"`, "ignoreNullValue"},
		{"keda null values read as 0", kedaData, keda, `ignoreNullValues: "false"`, `ignoreNullValues: "true"`, "ignoreNullValues"},
		{"keda metricType Value", kedaData, keda, "metricType: AverageValue", "metricType: Value", "metricType"},
		{"keda threshold 2", kedaData, keda, `threshold: "1"`, `threshold: "2"`, "threshold"},
		{"keda scale to zero", kedaData, keda, "minReplicaCount: 1\n", "minReplicaCount: 0\n", "minReplicaCount"},
		{"keda no scale-down window", kedaData, keda, "          stabilizationWindowSeconds: 300\n", "", "stabilizationWindowSeconds"},
		{"keda series basin does not record", kedaData, keda, "query: deployment_role:basin_capacity_needed_instances:max_over_time10m", "query: deployment_role:basin_capacity_needed_instance:max_over_time10m", "no recording rule"},
		{"keda query syntax", kedaData, keda, `role="prefill"}`, `role="prefill"`, "query"},
		{"keda other deployment", kedaData, keda, `{deployment="agents-prod", role="prefill"}`, `{deployment="agents", role="prefill"}`, "deployment"},
		{"keda no role", kedaData, keda, `{deployment="agents-prod", role="prefill"}`, `{deployment="agents-prod"}`, "role"},
		{"keda role twice", kedaData, keda, `role="decode"}`, `role="prefill"}`, "role prefill scaled 2 times"},
		{"keda serverAddress", kedaData, keda, "serverAddress: http://", "serverAddress: ", "serverAddress"},
		{"keda bad name", kedaData, keda, "name: sglang-prefill\n  namespace", "name: SGLang_Prefill\n  namespace", "metadata.name"},
		// HPA, decoded as the API server does.
		{"hpa misspelt field", hpaData, hpa, `averageValue: "1"`, `avarageValue: "1"`, "avarageValue"},
		{"hpa field in the wrong case", hpaData, hpa, "maxReplicas: 8", "MaxReplicas: 8", "MaxReplicas"},
		{"hpa maxReplicas a string", hpaData, hpa, "maxReplicas: 8", `maxReplicas: "8"`, "maxReplicas"},
		{"hpa duplicate field", hpaData, hpa, "  minReplicas: 1\n", "  minReplicas: 1\n  minReplicas: 2\n", "minReplicas"},
		{"hpa averageValue not a quantity", hpaData, hpa, `averageValue: "1"`, `averageValue: "one"`, "quantities"},
		{"hpa window over 3600 s", hpaData, hpa, "stabilizationWindowSeconds: 300", "stabilizationWindowSeconds: 7200", "stabilizationWindowSeconds"},
		{"hpa no policy", hpaData, hpa, "    scaleDown:\n      stabilizationWindowSeconds: 300\n      policies:\n        - type: Pods\n          value: 1\n          periodSeconds: 300\n", "    scaleDown:\n      stabilizationWindowSeconds: 300\n", "must specify at least one Policy"},
		{"hpa selectPolicy", hpaData, hpa, "selectPolicy: Max", "selectPolicy: Maximum", "selectPolicy"},
		// HPA, by what basin needs of it.
		{"hpa metric type", hpaData, hpa, "- type: External", "- type: Object", "External"},
		{"hpa target Value", hpaData, hpa, "type: AverageValue\n          averageValue: \"1\"", "type: Value\n          value: \"1\"", "AverageValue"},
		{"hpa target 2", hpaData, hpa, `averageValue: "1"`, `averageValue: "2"`, "want 1"},
		{"hpa metric the adapter does not serve", hpaData, hpa, "name: basin_capacity_needed_instances_max_over_time10m", "name: basin_capacity_needed_instances", "externalRules"},
		{"hpa selector without role", hpaData, hpa, "              role: prefill\n", "", "role"},
		{"hpa selector other deployment", hpaData, hpa, "deployment: agents-prod\n              role: decode", "deployment: agents-staging\n              role: decode", "deployment"},
		{"hpa minReplicas 0", hpaData, hpa, "  minReplicas: 1\n", "  minReplicas: 0\n", "minReplicas"},
		// prometheus-adapter's configuration.
		{"adapter misspelt field", adapterData, adapter, "seriesQuery:", "seriesQuerry:", "seriesQuerry"},
		{"adapter namespaced", adapterData, adapter, "      namespaced: false", "      namespaced: true", "namespaced"},
		{"adapter namespaced not a bool", adapterData, adapter, "      namespaced: false", "      namespaced: [no]", "into bool"},
		{"adapter series basin does not record", adapterData, adapter, "seriesQuery: 'deployment_role:basin_capacity_needed_instances:max_over_time10m", "seriesQuery: 'deployment:basin_capacity_needed_instances:max_over_time10m", "no recording rule"},
		{"adapter name does not match", adapterData, adapter, "matches: ^deployment_role", "matches: ^deployment_pool", "does not match"},
		{"adapter metricsQuery template", adapterData, adapter, "<<.LabelMatchers>>", "<<.LabelMatchers>", "metricsQuery"},
		{"adapter metricsQuery PromQL", adapterData, adapter, "max by (deployment, role) (", "max by (deployment, role (", "metricsQuery"},
		{"adapter as with colons", adapterData, adapter, "as: basin_capacity_needed_instances_max_over_time10m", "as: basin:capacity_needed_instances", "name.as"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.check(tc.data), "the example as it is passes")
			require.Contains(t, string(tc.data), tc.old, "the edit must apply to the example as it is")
			broken := bytes.Replace(tc.data, []byte(tc.old), []byte(tc.new), 1)
			err := tc.check(broken)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			t.Log(err)
		})
	}
}

// TestKEDASchemaLoads: the vendored CRD compiles with its patch, and the patch is what bounds the
// stabilisation window (without it, 7200 s would pass the schema).
func TestKEDASchemaLoads(t *testing.T) {
	withPatch, err := loadKEDASchema(kedaCRD, kedaCRDPatch)
	require.NoError(t, err)
	empty := filepath.Join(t.TempDir(), "empty-patch.yaml")
	require.NoError(t, os.WriteFile(empty, []byte("[]\n"), 0o644))
	without, err := loadKEDASchema(kedaCRD, empty)
	require.NoError(t, err)
	obj := map[string]any{
		"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": map[string]any{"name": "x"},
		"spec": map[string]any{
			"scaleTargetRef": map[string]any{"name": "x"},
			"triggers":       []any{map[string]any{"type": "prometheus", "metadata": map[string]any{}}},
			"advanced": map[string]any{"horizontalPodAutoscalerConfig": map[string]any{"behavior": map[string]any{
				"scaleDown": map[string]any{"stabilizationWindowSeconds": json.Number("7200")}}}},
		},
	}
	assert.Error(t, withPatch.Validate(obj), "the patched schema bounds the window at 3600 s")
	assert.NoError(t, without.Validate(obj), "the unpatched one does not (so the patch is applied)")
}

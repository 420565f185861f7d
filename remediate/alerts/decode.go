package alerts

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/alertmanager/template"
	"github.com/prometheus/common/model"
)

// payloadVersion is the only webhook payload version understood; Alertmanager has sent "4"
// since 0.16.
const payloadVersion = "4"

// Alert statuses in a payload (model.AlertFiring, model.AlertResolved).
const (
	statusFiring   = string(model.AlertFiring)
	statusResolved = string(model.AlertResolved)
)

// message is the webhook body. It is Alertmanager's notify/webhook.Message written out: that
// package is not imported because it drags in most of Alertmanager (about 67 modules, among them
// memberlist, a Kafka client, gRPC and OpenTelemetry) for these three fields, while template alone
// is light.
type message struct {
	*template.Data
	Version         string `json:"version"`
	GroupKey        string `json:"groupKey"`
	TruncatedAlerts uint64 `json:"truncatedAlerts"`
}

// fieldError is a rejected payload: Field is the path of the offending value (alerts[2].startsAt)
// or empty for the body as a whole, and Msg starts with that path (or "body") and says what is
// wrong.
type fieldError struct {
	Field string
	Msg   string
}

func (e *fieldError) Error() string { return e.Msg }

func badValue(field, format string, args ...any) *fieldError {
	return &fieldError{Field: field, Msg: field + ": " + fmt.Sprintf(format, args...)}
}

func badBody(format string, args ...any) *fieldError {
	return &fieldError{Msg: "body: " + fmt.Sprintf(format, args...)}
}

// decode parses and checks one webhook body. On success every alert has a status of firing or
// resolved, an alertname, a startsAt and a fingerprint (derived from the labels as Alertmanager
// does when the sender left it out).
func decode(body []byte) (*message, *fieldError) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, badBody("empty, want an Alertmanager webhook payload (a JSON object, version %q)", payloadVersion)
	}
	var m message
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&m); err != nil {
		return nil, explain(body, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, badBody("want one JSON object, found more after it")
	}
	if fe := m.check(); fe != nil {
		return nil, fe
	}
	return &m, nil
}

// check verifies what the receiver relies on, in the order a reader would fix it: the version
// first, because another version may mean another shape.
func (m *message) check() *fieldError {
	if m.Version != payloadVersion {
		return badVersion(m.Version)
	}
	if m.Data == nil || m.Status == "" {
		return badValue("status", "required, %q or %q", statusFiring, statusResolved)
	}
	if m.Status != statusFiring && m.Status != statusResolved {
		return badValue("status", "must be %q or %q, got %q", statusFiring, statusResolved, short(m.Status))
	}
	if len(m.Alerts) == 0 {
		return badValue("alerts", "required, at least one alert")
	}
	for i := range m.Alerts {
		a := &m.Alerts[i]
		p := fmt.Sprintf("alerts[%d]", i)
		switch {
		case a.Status == "":
			return badValue(p+".status", "required, %q or %q", statusFiring, statusResolved)
		case a.Status != statusFiring && a.Status != statusResolved:
			return badValue(p+".status", "must be %q or %q, got %q", statusFiring, statusResolved, short(a.Status))
		case a.Labels["alertname"] == "":
			return badValue(p+".labels.alertname", "required, the name of the alerting rule")
		case a.StartsAt.IsZero():
			return badValue(p+".startsAt", "required, an RFC 3339 time")
		}
		if a.Fingerprint == "" {
			a.Fingerprint = fingerprint(a.Labels)
		}
	}
	return nil
}

func badVersion(got string) *fieldError {
	if got == "" {
		return badValue("version", "required, %q (Alertmanager webhook payload version)", payloadVersion)
	}
	return badValue("version", "must be %q (Alertmanager webhook payload version), got %q", payloadVersion, short(got))
}

// fingerprint is Alertmanager's fingerprint of a label set (model.LabelSet.Fingerprint, the hash
// of the sorted pairs), so an alert posted with and without its fingerprint is one alert.
func fingerprint(labels map[string]string) string {
	ls := make(model.LabelSet, len(labels))
	for k, v := range labels {
		ls[model.LabelName(k)] = model.LabelValue(v)
	}
	return ls.Fingerprint().String()
}

// explain turns a decoding error into a fieldError. encoding/json names a mistyped field without
// its array index (alerts.startsAt) and a bad time not at all, so for those the body is decoded
// again one value at a time to find the path.
func explain(body []byte, err error) *fieldError {
	var (
		se *json.SyntaxError
		te *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &se):
		return badBody("invalid JSON at byte %d: %v", se.Offset, err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badBody("JSON ends early (cut off?)")
	case errors.As(err, &te) && te.Field == "":
		return badBody("must be a JSON object (an Alertmanager webhook payload), got JSON %s", te.Value)
	}
	if fe := locate(body); fe != nil {
		return fe
	}
	if errors.As(err, &te) {
		return badValue(te.Field, "must be %s, got JSON %s", jsonKind(te.Type), te.Value)
	}
	return badBody("%v", err)
}

// locate finds the first value of body (keys in sorted order, version first) that does not
// decode into its field of message, by decoding each on its own. Keys are matched to fields as
// encoding/json does, ignoring case.
func locate(body []byte) *fieldError {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return nil
	}
	keys := sortedKeys(top)
	for _, k := range keys {
		if !strings.EqualFold(k, "version") {
			continue
		}
		var v string
		if err := json.Unmarshal(top[k], &v); err != nil {
			return badValue("version", "must be the string %q, got JSON %s", payloadVersion, jsonValueKind(top[k]))
		}
		if v != payloadVersion {
			return badVersion(v)
		}
	}
	for _, k := range keys {
		if strings.EqualFold(k, "alerts") {
			if fe := locateAlerts(top[k]); fe != nil {
				return fe
			}
			continue
		}
		if fe := locateValue(&message{}, k, k, top[k]); fe != nil {
			return fe
		}
	}
	return nil
}

func locateAlerts(raw json.RawMessage) *fieldError {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return badValue("alerts", "must be an array of alerts, got JSON %s", jsonValueKind(raw))
	}
	for i, a := range list {
		p := fmt.Sprintf("alerts[%d]", i)
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(a, &fields); err != nil {
			return badValue(p, "must be an object, got JSON %s", jsonValueKind(a))
		}
		for _, k := range sortedKeys(fields) {
			if fe := locateValue(&template.Alert{}, p+"."+k, k, fields[k]); fe != nil {
				return fe
			}
		}
	}
	return nil
}

// locateValue decodes {key: raw} into a fresh dst and describes a failure as field's. Label maps
// are searched further, so that the message names the label.
func locateValue(dst any, field, key string, raw json.RawMessage) *fieldError {
	obj, _ := json.Marshal(map[string]json.RawMessage{key: raw})
	err := json.Unmarshal(obj, dst)
	if err == nil {
		return nil
	}
	switch fieldType(reflect.TypeOf(dst).Elem(), key) {
	case reflect.TypeFor[template.KV]():
		var labels map[string]json.RawMessage
		if json.Unmarshal(raw, &labels) != nil {
			return badValue(field, "must be an object of strings, got JSON %s", jsonValueKind(raw))
		}
		for _, name := range sortedKeys(labels) {
			var s string
			if json.Unmarshal(labels[name], &s) != nil {
				return badValue(field+"."+name, "must be a string, got JSON %s", jsonValueKind(labels[name]))
			}
		}
	case reflect.TypeFor[time.Time]():
		return badValue(field, "must be an RFC 3339 time such as \"2025-01-02T15:04:05Z\", got JSON %s", truncate(raw))
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return badValue(field, "must be %s, got JSON %s", jsonKind(te.Type), te.Value)
	}
	return badValue(field, "%v", err)
}

// fieldType is the type of the field of struct t (or of a struct it embeds by pointer) that
// encoding/json fills from key, ignoring case as encoding/json does; nil when there is none.
func fieldType(t reflect.Type, key string) reflect.Type {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Pointer && f.Type.Elem().Kind() == reflect.Struct {
			if ft := fieldType(f.Type.Elem(), key); ft != nil {
				return ft
			}
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if f.IsExported() && strings.EqualFold(name, key) {
			return f.Type
		}
	}
	return nil
}

// quoteMax bounds a value quoted back in an error message: the sender may have made it huge, and
// the message is logged too.
const quoteMax = 64

// truncate shortens a raw value quoted in an error message.
func truncate(raw json.RawMessage) string { return short(string(raw)) }

// short shortens a string quoted in an error message, on a rune boundary.
func short(s string) string {
	if len(s) <= quoteMax {
		return s
	}
	cut := quoteMax
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// jsonKind says what JSON a Go type wants.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Uint, reflect.Uint64, reflect.Uint32:
		return "a non-negative integer"
	case reflect.Float64, reflect.Float32:
		return "a number"
	case reflect.Slice:
		return "an array"
	case reflect.Struct, reflect.Map, reflect.Pointer:
		return "an object"
	}
	return "of another type"
}

// jsonValueKind names the kind of a raw JSON value, for messages.
func jsonValueKind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	}
	return "number"
}

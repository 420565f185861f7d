// Package alerts receives Alertmanager's webhook and turns the alerts basin cares about into
// incident mode: while any configured alert fires, the daemon keeps the session budget tight, and
// it lets go only when every one of them has resolved (or, failing a resolve, expired).
//
// # Wire format
//
// Alertmanager posts webhook payload version 4 (docs/configuration.md, <webhook_config>). The body
// is decoded into Alertmanager's own template.Data, pinned through go.mod, inside a three-field
// envelope (version, groupKey, truncatedAlerts) written here: notify/webhook.Message is the same
// envelope, but importing it pulls in most of Alertmanager. Unknown fields are accepted, because
// Alertmanager adds keys between minor versions (notification_reason, routeLabels) and a receiver
// that rejected them would drop notifications after an Alertmanager upgrade. Everything this
// package relies on is checked, and a payload that fails a check is answered 400 with a JSON error
// naming the field (alerts[2].labels.alertname); Alertmanager does not retry a 4xx, so the error
// is also logged.
//
// # What is tracked
//
// Only alerts that match one of Options.Matchers count; the rest are acknowledged and ignored.
// Matching alerts are keyed by fingerprint (Alertmanager's hash of the label set, derived the same
// way when a sender leaves it out). Alertmanager sends every alert of a group in each
// notification, firing and resolved together, so a notification is a set of per-alert facts, not
// a group verdict: a firing alert is added or refreshed, a resolved alert removes its entry.
// Repeats are idempotent.
//
// Deliveries can overlap and arrive out of order (retries, several Alertmanager replicas, a
// flapping alert). Two rules keep a stale notification from undoing a newer one. A resolve removes
// an entry only if the episode it ends did not end before the tracked episode started (its endsAt
// is compared with the tracked startsAt), so the late resolve of an earlier episode leaves a newer
// firing one alone. A resolve is also remembered for a while, so a firing notice of the same
// episode (startsAt not after the remembered end) that arrives after it is ignored instead of
// starting the incident again; a later episode has a later startsAt and does start it.
//
// # Expiry
//
// Alertmanager blanks endsAt of the firing alerts it sends (dispatch: "ensure that alerts don't
// resolve as time moves forwards"), and it notifies again only when the group changes or
// repeat_interval passes. A firing alert with no endsAt therefore stays active for Options.MaxAge
// after its last notification; a firing alert that does carry an endsAt (another sender) stays
// active until then. Expiry is the safety net for a resolve that never arrives (Alertmanager
// restarted, send_resolved false), so basin's route must repeat well within MaxAge: Alertmanager
// repeats only on a group_interval tick after repeat_interval has fully passed, which is why a
// repeat_interval equal to group_interval repeats every second tick. With the default MaxAge of 10
// minutes:
//
//	route:
//	  routes:
//	    - receiver: basin
//	      matchers: ['alertname=~"BasinMetastableDrift|BasinTrapped|BasinHitRateCollapsed"']
//	      group_wait: 10s      # tighten soon after the alert fires
//	      group_interval: 1m
//	      repeat_interval: 3m  # well inside MaxAge
//	      continue: true       # the humans' receivers still get the alert
//	receivers:
//	  - name: basin
//	    webhook_configs:
//	      - url: http://basin:9095/api/v1/alerts
//	        send_resolved: true
//	        http_config:
//	          authorization:
//	            credentials_file: /etc/alertmanager/basin-token
//
// Following Alertmanager's own reading of an alert, a "firing" alert whose endsAt has already
// passed is resolved.
//
// # Running it
//
// New validates Options. The Receiver is an http.Handler the daemon mounts at Path; Run sweeps
// expired alerts so that incident mode ends on time even when nothing is posted. OnChange is
// called, in order and outside every lock, once per switch of incident mode. State and Restore
// carry the tracked alerts across a restart of the daemon, so a restart in the middle of an
// incident does not forget it (Alertmanager would only remind basin at the next repeat).
package alerts

// Package replication is a gateway's replicated mode (docs/scaling.md). Several gateway
// replicas share one budget: one of them, elected through a lease in Redis or Valkey, is the
// admission leader and runs the admission core as a single gateway does; the others follow.
//
// Every replica keeps a local admission core. On the leader it is the deployment's table. On a
// follower it is a mirror of the sessions this replica has served: a call of a session live in it
// passes at once (its begin and finish are sent to the leader in a batch every report_interval);
// a session's first call on this replica asks the leader (one RPC, which the leader holds while
// the session is queued) and the session then enters the mirror. When the leader or the store
// cannot be reached the follower is degraded: live calls still pass, and new sessions are
// admitted by the mirror itself against a slice of the budget the leader had free at the last
// contact, divided by the replicas seen (or refused, with degraded_admission: refuse). The
// sessions it admitted alone are reported to the next leader it reaches, which takes them as
// live (admission.Core.Merge): an admitted session is never cut.
//
// A new leader loads the table its predecessor persisted (every admission before its first call
// is forwarded, the rest every second, each write fenced by the lease's epoch so a deposed
// leader's late write is refused), merges its own mirror, and announces its admin URL in the
// store.
//
// A Replica is one gateway's part in it. It drives the gateway's admission core directly, and
// asks the gateway, through Host, only for what the gateway alone keeps: the calls waiting at
// it, the Responses chains it answered, and the settings saved beside the table. The gateway,
// in turn, asks its Replica (or, alone, its single stand-in) at every point where a replica
// does what a gateway alone does not.
package replication

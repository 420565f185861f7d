package scaler

// Role is the part of a disaggregated deployment an instance serves.
type Role string

// Roles basin sizes and scales.
const (
	// RolePrefill instances hold the prefix cache: the cache knee is theirs.
	RolePrefill Role = "prefill"
	// RoleDecode instances hold the running calls' KV: decode memory is theirs.
	RoleDecode Role = "decode"
)

// Roles lists the roles in a stable order (metrics, reasons, plans).
func Roles() []Role { return []Role{RolePrefill, RoleDecode} }

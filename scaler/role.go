package scaler

// Roles lists the roles in a stable order (metrics, reasons, plans).
func Roles() []Role { return []Role{RolePrefill, RoleDecode} }

package auth

import "context"

// infoKey is the context key of the caller's Info.
type infoKey struct{}

// NewContext returns ctx carrying the caller the server's interceptors
// established.
func NewContext(ctx context.Context, info *Info) context.Context {
	return context.WithValue(ctx, infoKey{}, info)
}

// FromContext returns the caller NewContext put in ctx, or nil when auth
// is off or the caller is anonymous. Proposals copy it into their raft
// header, so that the applier checks the write against the caller's
// permissions as they are when it applies.
func FromContext(ctx context.Context) *Info {
	info, _ := ctx.Value(infoKey{}).(*Info)
	return info
}

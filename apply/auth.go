package apply

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/mvcc"
)

// Auth applies replicated auth requests (the InternalRaftRequest Auth*
// fields and Authenticate) into the entry's write batch, and checks a
// user's write against the auth state as it is when the write is applied
// (etcd's auth applier): a permission revoked after the proposal is
// honoured, identically on every member.
type Auth interface {
	// Apply returns handled=false to let the applier apply r itself. A
	// refusal is a Result with an error; a returned error is fatal.
	Apply(w *mvcc.WriteBatch, r *pb.InternalRaftRequest) (res Result, handled bool, err error)
}

// SetAuth sets the auth state machine. It must be called before Run; nil
// (the default) refuses auth requests as unsupported.
func (a *Applier) SetAuth(x Auth) { a.auth = x }

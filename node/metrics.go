package node

// LeaderChanges returns how many times this node has seen a new leader
// (etcd_server_leader_changes_seen_total): a change from no leader or from
// another member to a known leader counts once; losing the leader does not.
// Safe from any goroutine.
func (n *Node) LeaderChanges() uint64 { return n.leaderChanges.Load() }

package node

// LeaderChanges returns how many times this node has seen a new leader
// (etcd_server_leader_changes_seen_total): a change from no leader or from
// another member to a known leader counts once; losing the leader does not.
// Safe from any goroutine.
func (n *Node) LeaderChanges() uint64 { return n.leaderChanges.Load() }

// IncomingWaits returns how many appends this node held as a leader for
// writes on their way (incoming.go), and how many of those holds ran to
// Config.IncomingWait. Many timeouts mean counted writes that are slow to
// reach the node, or never do. Safe from any goroutine.
func (n *Node) IncomingWaits() (waits, timeouts uint64) {
	return n.incomingWaits.Load(), n.incomingTimeouts.Load()
}

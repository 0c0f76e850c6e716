package agent

// NoteKeysHeld is how many keys n remembers.
func NoteKeysHeld(n *FileNotes) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.keys.Len()
}

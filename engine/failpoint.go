package engine

// Failpoints are test hooks at the engine's durability boundaries, in the
// spirit of bbolt's gofail. They are nil in production. A hook that returns
// an error stops the execution on the spot, committing nothing more, as a
// kill -9 at that point would.
var failpoints struct {
	// afterStepBeforeCommit runs when a superstep's tasks have returned and
	// nothing of the step is committed yet.
	afterStepBeforeCommit func(step int) error
	// afterCommitBeforePublish runs when a commit is durable and its events
	// are not yet published.
	afterCommitBeforePublish func(c *Commit) error
}

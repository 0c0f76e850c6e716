package engine

import "time"

// Backoff exposes the retry backoff computation to the black-box tests.
var Backoff = backoff

// WithClock returns cfg with now in place of the wall clock, for its
// run's active time and its record's times.
func WithClock(cfg RunConfig, now func() time.Time) RunConfig {
	cfg.clock = now
	return cfg
}

// WithManagerClock returns opts with now in place of the wall clock, for
// the active time and the records of the manager's runs.
func WithManagerClock(opts ManagerOptions, now func() time.Time) ManagerOptions {
	opts.clock = now
	return opts
}

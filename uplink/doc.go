// Package uplink drains an appliance's outcome ledger to a collector
// upstream, and is that collector.
//
// The sending side, modelled on litestream's replication: New (or Start,
// which also runs it in the background) makes an *Uplink over a store.DB.
// Run sends NDJSON batches in seq order, with an idempotency key, an
// HMAC-SHA256 signature of the body and the chain head (see wire.go), and
// advances the store's cursor only on 200 {"acked_seq"}. Connection errors,
// timeouts, 408, 429 and 5xx are retried with capped, fully jittered
// exponential backoff (Retry-After is honoured). A 409 gap that starts
// below the cursor means the collector lost records it had acknowledged
// (restored from a backup): the uplink sends again from the seq it
// expects, at once. Any other 4xx parks the batch, which stays in the
// ledger. Flush sends now and waits; Status shows
// the cursor, the backlog, the last error and a parked batch. Redaction
// happens on the way out (EncodeRecord), per the bundle's policy, in a way
// that still lets the collector verify the hash chain.
//
// The receiving side: NewCollector returns an http.Handler for POST
// /v1/outcomes and GET /v1/appliances over a CollectorStore: OpenBoltStore
// (embedded, the default) or OpenPostgresStore (for several collectors
// behind a load balancer, which share the bearer token the database holds:
// PostgresStore.SharedToken). It refuses a body that is not declared
// application/x-ndjson (415), verifies the HMAC per appliance, each
// record's hash and the chain's continuity (PlanAppend, shared by both
// stores), stores each (appliance, seq) once and answers a repeated batch
// as it did the first time. An unknown appliance and a bad signature get
// the same answer (401 "unauthorized"; the log tells them apart), so that
// the answers do not tell which appliance ids exist. Only a signed batch
// that shows a fork, a bad link or an altered record marks an
// appliance's chain "broken"; a gap does not. GET /v1/appliances takes
// the collector's bearer token (CollectorOptions.Token; outpost collector
// keeps it in TokenFile). Every error, a stray path or method included, is
// {"error": {"code", "message"}}. The conformance suite in
// collectorstore_test.go runs against every CollectorStore.
//
// Examples are the best way to understand it: chaos_test.go runs an
// appliance and a collector through a failing proxy and restarts.
package uplink

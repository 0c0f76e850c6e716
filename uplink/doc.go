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
// behind a load balancer). It refuses a body that is not declared
// application/x-ndjson (415), verifies the HMAC per appliance, each
// record's hash and the chain's continuity (PlanAppend, shared by both
// stores), stores each (appliance, seq) once and answers a repeated batch
// as it did the first time. The conformance suite in
// collectorstore_test.go runs against every CollectorStore.
//
// Examples are the best way to understand it: chaos_test.go runs an
// appliance and a collector through a failing proxy and restarts.
package uplink

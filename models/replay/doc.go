// Package replay is a models.Provider that answers with the responses
// recorded for an earlier run, so that run can be re-executed exactly for an
// audit.
//
// The caller owns storage: [New] takes a lookup that loads the response
// recorded under a [Key] (run, step, task, call index), typically a blob
// decoded with models.DecodeResponse. Each model call names its key through
// the context with [WithKey]; [KeyFrom] reads it back.
//
// A call whose key has no record fails with an error naming the key and
// wrapping [ErrNotRecorded]. When the record carries a request hash
// (models.Response.RequestHash) and the request now differs, the call fails
// with [*Diverged], which says where the replay parts from the original.
package replay

package engine

// Backoff exposes the retry backoff computation to the black-box tests.
var Backoff = backoff

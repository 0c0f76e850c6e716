package uplink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresStore is the collector's store for a fleet: several collector
// processes behind a load balancer share one database. Records have the
// primary key (appliance_id, seq), so each is stored once whichever process
// receives it, and a batch locks its appliance's head row (SELECT … FOR
// UPDATE) while it checks and extends the chain.
type PostgresStore struct {
	pool       *pgxpool.Pool
	schemaName string
	schema     string // sanitized, for SQL text
}

var _ CollectorStore = (*PostgresStore)(nil)

// CheckPostgresDSN reports a dsn that OpenPostgresStore could not parse,
// without connecting, so that a command can refuse it before it starts.
func CheckPostgresDSN(dsn string) error {
	if _, err := pgxpool.ParseConfig(dsn); err != nil {
		return fmt.Errorf("collector postgres: %w", err)
	}
	return nil
}

// OpenPostgresStore connects to dsn and creates the collector's tables in
// schema ("outpost" when empty) if they do not exist.
func OpenPostgresStore(ctx context.Context, dsn, schema string) (*PostgresStore, error) {
	if schema == "" {
		schema = "outpost"
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("collector postgres: %w", err)
	}
	s := &PostgresStore{pool: pool, schemaName: schema, schema: pgx.Identifier{schema}.Sanitize()}
	ddl := fmt.Sprintf(`
CREATE SCHEMA IF NOT EXISTS %[1]s;
CREATE TABLE IF NOT EXISTS %[1]s.appliances (
	appliance_id  text PRIMARY KEY,
	last_seq      bigint NOT NULL DEFAULT 0,
	last_hash     text NOT NULL DEFAULT '',
	last_seen     timestamptz NOT NULL DEFAULT now(),
	broken_at_seq bigint NOT NULL DEFAULT 0,
	error         text NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS %[1]s.outcomes (
	appliance_id text NOT NULL,
	seq          bigint NOT NULL,
	hash         text NOT NULL,
	prev_hash    text NOT NULL,
	record       bytea NOT NULL,
	received_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (appliance_id, seq)
);
CREATE TABLE IF NOT EXISTS %[1]s.collector_token (
	one   boolean PRIMARY KEY DEFAULT true CHECK (one),
	token text NOT NULL
);`, s.schema)
	// Two collectors starting together may race to create the tables; the
	// loser's error is harmless once they exist.
	for attempt := 0; ; attempt++ {
		_, err = pool.Exec(ctx, ddl)
		if err == nil || attempt == 3 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("collector postgres: create tables: %w", err)
	}
	return s, nil
}

// SharedToken returns the bearer token of GET /v1/appliances that the
// collectors on this database share: the one the database holds, or,
// when it holds none yet, token, which it stores. Of collectors that start
// together, the first to store its token wins (the table holds one row, and
// the others' inserts do nothing once it is committed) and the others read
// it, so an appliance list fetched with it works against any of them.
func (s *PostgresStore) SharedToken(ctx context.Context, token string) (string, error) {
	if len(token) < 32 || strings.ContainsAny(token, " \t\r\n") {
		return "", fmt.Errorf("collector postgres: a token must be at least 32 characters without spaces")
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO `+s.schema+`.collector_token (token) VALUES ($1) ON CONFLICT DO NOTHING`, token); err != nil {
		return "", fmt.Errorf("collector postgres: store the token: %w", err)
	}
	var shared string
	if err := s.pool.QueryRow(ctx, `SELECT token FROM `+s.schema+`.collector_token`).Scan(&shared); err != nil {
		return "", fmt.Errorf("collector postgres: read the token: %w", err)
	}
	return shared, nil
}

// Close closes the connection pool.
func (s *PostgresStore) Close() error { s.pool.Close(); return nil }

// lockHead makes sure the appliance's head row exists and locks it for the
// transaction.
func (s *PostgresStore) lockHead(ctx context.Context, tx pgx.Tx, appliance string) (Head, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.schema+`.appliances (appliance_id) VALUES ($1) ON CONFLICT DO NOTHING`, appliance); err != nil {
		return Head{}, err
	}
	var h Head
	var last int64
	err := tx.QueryRow(ctx, `SELECT last_seq, last_hash FROM `+s.schema+`.appliances WHERE appliance_id = $1 FOR UPDATE`, appliance).Scan(&last, &h.LastHash)
	h.LastSeq = uint64(last)
	return h, err
}

// Append implements CollectorStore.
func (s *PostgresStore) Append(ctx context.Context, appliance string, batch []*Record, now time.Time) (Head, error) {
	var out Head
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		head, err := s.lockHead(ctx, tx, appliance)
		if err != nil {
			return err
		}
		var held map[uint64]string
		fresh, err := PlanAppend(head, batch, func(seq uint64) (string, bool, error) {
			if held == nil {
				held = map[uint64]string{}
				rows, err := tx.Query(ctx, `SELECT seq, hash FROM `+s.schema+`.outcomes WHERE appliance_id = $1 AND seq BETWEEN $2 AND $3`,
					appliance, int64(batch[0].Seq), int64(batch[len(batch)-1].Seq))
				if err != nil {
					return "", false, err
				}
				for rows.Next() {
					var sq int64
					var h string
					if err := rows.Scan(&sq, &h); err != nil {
						return "", false, err
					}
					held[uint64(sq)] = h
				}
				if err := rows.Err(); err != nil {
					return "", false, err
				}
			}
			h, ok := held[seq]
			return h, ok, nil
		})
		if err != nil {
			return err
		}
		if len(fresh) > 0 {
			rows := make([][]any, len(fresh))
			for i, r := range fresh {
				rows[i] = []any{appliance, int64(r.Seq), r.Hash, r.PrevHash, r.Line, now.UTC()}
			}
			if _, err := tx.CopyFrom(ctx, pgx.Identifier{s.schemaName, "outcomes"},
				[]string{"appliance_id", "seq", "hash", "prev_hash", "record", "received_at"}, pgx.CopyFromRows(rows)); err != nil {
				return err
			}
			last := fresh[len(fresh)-1]
			head = Head{last.Seq, last.Hash}
		}
		_, err = tx.Exec(ctx, `UPDATE `+s.schema+`.appliances SET last_seq = $2, last_hash = $3, last_seen = $4,
			broken_at_seq = CASE WHEN broken_at_seq <> 0 AND $2 >= broken_at_seq THEN 0 ELSE broken_at_seq END,
			error = CASE WHEN broken_at_seq <> 0 AND $2 >= broken_at_seq THEN '' ELSE error END
			WHERE appliance_id = $1`, appliance, int64(head.LastSeq), head.LastHash, now.UTC())
		out = head
		return err
	})
	var ce *ChainError
	if err != nil && !errors.As(err, &ce) {
		err = fmt.Errorf("collector postgres: append: %w", err)
	}
	return out, err
}

// MarkBroken implements CollectorStore.
func (s *PostgresStore) MarkBroken(ctx context.Context, appliance string, e *ChainError, now time.Time) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO `+s.schema+`.appliances (appliance_id, last_seen, broken_at_seq, error) VALUES ($1, $2, $3, $4)
		ON CONFLICT (appliance_id) DO UPDATE SET last_seen = $2, broken_at_seq = $3, error = $4`,
		appliance, now.UTC(), int64(max(e.Seq, 1)), e.Msg)
	if err != nil {
		return fmt.Errorf("collector postgres: mark broken: %w", err)
	}
	return nil
}

// Appliances implements CollectorStore.
func (s *PostgresStore) Appliances(ctx context.Context) ([]ApplianceStatus, error) {
	rows, err := s.pool.Query(ctx, `SELECT appliance_id, last_seq, last_seen, broken_at_seq, error FROM `+s.schema+`.appliances ORDER BY appliance_id`)
	if err != nil {
		return nil, fmt.Errorf("collector postgres: appliances: %w", err)
	}
	defer rows.Close()
	var out []ApplianceStatus
	for rows.Next() {
		var id, msg string
		var last, broken int64
		var seen time.Time
		if err := rows.Scan(&id, &last, &seen, &broken, &msg); err != nil {
			return nil, fmt.Errorf("collector postgres: appliances: %w", err)
		}
		out = append(out, statusOf(id, uint64(last), seen, uint64(broken), msg))
	}
	return out, rows.Err()
}

// Records implements CollectorStore.
func (s *PostgresStore) Records(ctx context.Context, appliance string, after uint64, limit int) ([]*Record, error) {
	q := `SELECT seq, hash, prev_hash, record FROM ` + s.schema + `.outcomes WHERE appliance_id = $1 AND seq > $2 ORDER BY seq`
	args := []any{appliance, int64(after)}
	if limit > 0 {
		q += ` LIMIT $3`
		args = append(args, limit)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("collector postgres: records: %w", err)
	}
	defer rows.Close()
	var out []*Record
	for rows.Next() {
		r := &Record{ApplianceID: appliance}
		var seq int64
		if err := rows.Scan(&seq, &r.Hash, &r.PrevHash, &r.Line); err != nil {
			return nil, fmt.Errorf("collector postgres: records: %w", err)
		}
		r.Seq = uint64(seq)
		out = append(out, r)
	}
	return out, rows.Err()
}

package pgtest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

// dockerServer is a postgres container started through dockertest.
type dockerServer struct {
	pool     *dockertest.Pool
	resource *dockertest.Resource
	dsn      string
}

// DockerImage is the image used when no local binaries are found.
const DockerImage = "postgres"

// DockerTag matches the PostgreSQL major version CI installs from Debian.
const DockerTag = "15"

func startDocker(ctx context.Context, opts Options) (*dockerServer, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, fmt.Errorf("no Docker daemon answers: %w", err)
	}
	maxConn := opts.MaxConnections
	if maxConn == 0 {
		maxConn = 300
	}
	fsync := "off"
	if opts.Fsync {
		fsync = "on"
	}
	cmd := []string{"postgres", "-c", fmt.Sprintf("max_connections=%d", maxConn), "-c", "fsync=" + fsync}
	for _, s := range opts.Settings {
		cmd = append(cmd, "-c", s)
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: DockerImage,
		Tag:        DockerTag,
		Env:        []string{"POSTGRES_HOST_AUTH_METHOD=trust"},
		Cmd:        cmd,
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return nil, fmt.Errorf("start container: %w", err)
	}
	// A test process that dies without Stop must not leave the container running forever.
	_ = res.Expire(30 * 60)
	ds := &dockerServer{pool: pool, resource: res,
		dsn: fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", res.GetHostPort("5432/tcp"))}
	pool.MaxWait = 2 * time.Minute
	if err := pool.Retry(func() error {
		conn, err := pgx.Connect(ctx, ds.dsn)
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	}); err != nil {
		ds.stop()
		return nil, fmt.Errorf("container never answered: %w", err)
	}
	return ds, nil
}

func (d *dockerServer) stop() { _ = d.pool.Purge(d.resource) }

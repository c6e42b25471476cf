package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

// dockerServer is a redis container started through dockertest.
type dockerServer struct {
	pool     *dockertest.Pool
	resource *dockertest.Resource
	addr     string
}

// DockerImage and DockerTag are used when no local binary is found; the
// tag matches the version CI installs from Debian.
const (
	DockerImage = "redis"
	DockerTag   = "7.0"
)

func startDocker(ctx context.Context, settings []string) (*dockerServer, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, fmt.Errorf("no Docker daemon answers: %w", err)
	}
	cmd := []string{"redis-server", "--save", ""}
	for _, s := range settings {
		name, value, _ := strings.Cut(s, " ")
		if unquoted, err := strconv.Unquote(value); err == nil {
			value = unquoted // save "" is the empty argument
		}
		cmd = append(cmd, "--"+name, value)
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{Repository: DockerImage, Tag: DockerTag, Cmd: cmd},
		func(hc *docker.HostConfig) {
			hc.AutoRemove = true
			hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
		})
	if err != nil {
		return nil, fmt.Errorf("start container: %w", err)
	}
	// A test process that dies without Close must not leave it running forever.
	_ = res.Expire(30 * 60)
	ds := &dockerServer{pool: pool, resource: res, addr: "redis://" + res.GetHostPort("6379/tcp") + "/0"}
	pool.MaxWait = time.Minute
	if err := pool.Retry(func() error {
		c, err := Client(ds.addr)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Ping(ctx).Err()
	}); err != nil {
		ds.stop()
		return nil, fmt.Errorf("container never answered: %w", err)
	}
	return ds, nil
}

func (d *dockerServer) stop() { _ = d.pool.Purge(d.resource) }

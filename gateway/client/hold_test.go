package client_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/client"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/remediate/admissiontest"
)

// The daemon reads and acts on the gateway through this interface.
var _ remediate.Admission = (*client.Client)(nil)

func TestHoldAndResumeThroughTheGateway(t *testing.T) {
	tg := startGateway(t, 1000000, nil)
	c := tg.client(t)
	ctx := context.Background()
	require.Equal(t, http.StatusOK, status(t, tg.chat(t, "s")))
	waitState(t, c, "s idle", func(v adminapi.StateView) bool { return v.Live == 1 && v.InCall == 0 })

	_, err := c.Hold(ctx, holdReq([]string{"s", "nobody"}, nil, "test: trapped"))
	require.NoError(t, err)
	v, err := c.State(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, v.Held)
	require.Len(t, v.Sessions, 1)
	assert.True(t, v.Sessions[0].Held)

	call := tg.chat(t, "s")
	waitState(t, c, "the call held", func(v adminapi.StateView) bool { return v.HeldCalls == 1 })
	select {
	case s := <-call:
		t.Fatalf("the held call was answered %d before the resume", s)
	default:
	}

	r, err := c.Hold(ctx, holdReq(nil, []string{"s"}, "test: recovered"))
	require.NoError(t, err)
	assert.Equal(t, adminapi.HoldResult{Resumed: 1, Released: []string{"s"}}, r)
	assert.Equal(t, http.StatusOK, status(t, call), "proxied once resumed")

	// The same resume again changes nothing.
	r, err = c.Hold(ctx, holdReq(nil, []string{"s"}, "test: recovered"))
	require.NoError(t, err)
	assert.Equal(t, adminapi.HoldResult{Released: []string{}}, r)
}

func TestHoldRefusalsAreAPIErrors(t *testing.T) {
	tg := startGateway(t, 1000000, nil)
	good := tg.client(t)
	wrong, err := client.New(client.Options{BaseURL: tg.admin.URL, Token: "not-the-token"})
	require.NoError(t, err)
	ctx := context.Background()
	for _, tc := range []struct {
		name         string
		c            *client.Client
		hold, resume []string
		reason       string
		status       int
		param        string
		inTheMessage string
	}{
		{"wrong token", wrong, []string{"s"}, nil, "attack", http.StatusUnauthorized, "", "admin token"},
		{"no ids", good, nil, nil, "r", http.StatusBadRequest, "hold", "at least one"},
		{"empty id", good, nil, []string{"s", ""}, "r", http.StatusBadRequest, "resume[1]", "empty"},
		{"no reason", good, []string{"s"}, nil, " ", http.StatusBadRequest, "reason", "reason: required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.c.Hold(ctx, holdReq(tc.hold, tc.resume, tc.reason))
			var ae *client.APIError
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, tc.status, ae.Status)
			assert.Equal(t, tc.param, ae.Param)
			assert.Contains(t, ae.Message, tc.inTheMessage)
			assert.True(t, strings.HasPrefix(err.Error(), "hold: "), "the operation leads: %s", err)
		})
	}

	t.Run("stale term", func(t *testing.T) {
		_, err := good.ClaimTerm(client.WithTerm(ctx, 5))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status(t, tg.chat(t, "s")))
		_, err = good.Hold(client.WithTerm(ctx, 4), holdReq([]string{"s"}, nil, "deposed"))
		assert.ErrorIs(t, err, client.ErrStaleTerm)
		_, err = good.Hold(client.WithTerm(ctx, 5), holdReq(nil, []string{"s"}, "current"))
		require.NoError(t, err, "the current term's write goes through")
	})
	v, err := good.State(ctx)
	require.NoError(t, err)
	assert.Zero(t, v.Held, "no refused call held anything")
	assert.Zero(t, v.Counters.Held)
}

func TestStateListsSessionsWithTheQueueTailWhenAsked(t *testing.T) {
	tg := startGateway(t, 1000000, nil)
	require.Equal(t, http.StatusOK, status(t, tg.chat(t, "s")))
	for _, tc := range []struct {
		name     string
		o        client.Options
		wantList bool
	}{
		{"everything", client.Options{}, true},
		{"queue tail", client.Options{QueueTail: 4}, false},
		{"queue tail and sessions", client.Options{QueueTail: 4, Sessions: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.BaseURL, o.Token = tg.admin.URL, testToken
			c, err := client.New(o)
			require.NoError(t, err)
			v, err := c.State(context.Background())
			require.NoError(t, err)
			assert.Equal(t, 1, v.Live)
			if !tc.wantList {
				assert.Nil(t, v.Sessions)
				return
			}
			require.Len(t, v.Sessions, 1)
			assert.Equal(t, "s", v.Sessions[0].ID)
		})
	}
}

// TestConformance runs the admission contract's suite against the client of a real gateway
// whose upstream answers every call at once with 100 prompt + 10 completion tokens: the same
// answers as the core served in process (gateway/admission/inproc).
func TestConformance(t *testing.T) {
	admissiontest.Run(t, func(t *testing.T, budget int64) admissiontest.Deployment {
		tg := startGateway(t, budget, nil)
		return admissiontest.Deployment{Admission: tg.client(t), ContextTokens: 110, Call: func(id string) { tg.chat(t, id) }}
	})
}

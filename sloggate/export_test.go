package sloggate

import "time"

// DefaultInterval and EventsEvery give the tests Events' interval and a
// shorter one.
const DefaultInterval = time.Second

var EventsEvery = events

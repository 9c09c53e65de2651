package bulkhead

import "time"

// DefaultSlogInterval and SlogEventsEvery give the tests SlogEvents'
// interval and a shorter one.
const DefaultSlogInterval = time.Second

var SlogEventsEvery = slogEvents

#pragma once
// An entry's key between a driver and its remote ranks: driver::entry_key (the program and the step's
// shape; the head is not part of the graph a rank runs) as the schema's EntryKey and back. Reading one
// from the wire checks every value's range and refuses by what is wrong; it never throws.
#include <string>

#include "engine/core/result.hpp"
#include "engine/driver/driver.hpp"
#include "transport/messages.hpp"

namespace troupe::actors {

transport::entry_key to_wire(const driver::entry_key& k);
result<driver::entry_key, std::string> from_wire(const transport::entry_key& k);

}  // namespace troupe::actors

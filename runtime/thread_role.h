// runtime/thread_role.h: tells the control path whether it is running on one of the runtime's
// own poller or event threads (inside an OrphanHandler or DeviceEventHandler). Control calls hold
// the runtime mutex while they wait for those threads, so from them they are refused instead.
#ifndef CQD_RUNTIME_THREAD_ROLE_H_
#define CQD_RUNTIME_THREAD_ROLE_H_

namespace cqd::internal {

inline thread_local bool tls_runtime_thread = false;

// Called once at the start of a poller or the event thread.
inline void MarkRuntimeThread() { tls_runtime_thread = true; }
inline bool OnRuntimeThread() { return tls_runtime_thread; }

}  // namespace cqd::internal

#endif  // CQD_RUNTIME_THREAD_ROLE_H_
